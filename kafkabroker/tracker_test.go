package kafkabroker

import (
	"testing"
)

func TestTrackerContiguousPrefix(t *testing.T) {
	type step struct {
		op   string // "ack", "nak", "redeliver"
		idx  int    // entry index in add order
		want int64  // commit point after the step (-1: nothing to commit)
	}
	tests := []struct {
		name  string
		offs  []int64
		steps []step
	}{
		{"in order", []int64{0, 1, 2}, []step{{"ack", 0, 1}, {"ack", 1, 2}, {"ack", 2, 3}}},
		{"gap then fill", []int64{0, 1, 2}, []step{{"ack", 0, 1}, {"ack", 2, 1}, {"ack", 1, 3}}},
		{"head last", []int64{0, 1, 2}, []step{{"ack", 2, 0}, {"ack", 1, 0}, {"ack", 0, 3}}},
		{"offset holes (txn markers)", []int64{5, 7, 10}, []step{{"ack", 0, 7}, {"ack", 2, 7}, {"ack", 1, 11}}},
		{"nak holds the commit", []int64{0, 1, 2}, []step{{"nak", 1, 0}, {"ack", 0, 1}, {"ack", 2, 1}, {"redeliver", 1, 1}, {"ack", 1, 3}}},
		{"term settles like ack", []int64{0, 1}, []step{{"ack", 1, 0}, {"ack", 0, 2}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker()
			var es []*entry
			for _, o := range tc.offs {
				es = append(es, tr.add(o, 0, nil))
			}
			for i, s := range tc.steps {
				e := es[s.idx]
				var ok bool
				switch s.op {
				case "ack":
					ok = tr.settle(e)
				case "nak":
					ok = tr.nak(e)
				case "redeliver":
					ok = tr.redeliver(e)
				}
				if !ok {
					t.Fatalf("step %d %s(%d): refused", i, s.op, s.idx)
				}
				if tr.commitOff != s.want {
					t.Fatalf("step %d %s(%d): commit point %d, want %d", i, s.op, s.idx, tr.commitOff, s.want)
				}
			}
			if tr.unsettled() != 0 {
				t.Fatalf("unsettled = %d after all settled", tr.unsettled())
			}
		})
	}
}

func TestTrackerRefetchIgnored(t *testing.T) {
	tr := newTracker()
	if tr.add(3, 0, nil) == nil || tr.add(4, 0, nil) == nil {
		t.Fatal("add refused")
	}
	if tr.add(4, 0, nil) != nil || tr.add(2, 0, nil) != nil {
		t.Fatal("an offset at or below one tracked was added again")
	}
	e := tr.add(5, 0, nil)
	if !tr.settle(e) || tr.settle(e) {
		t.Fatal("settle twice: want true then false")
	}
	if off, _, ok := tr.toCommit(); !ok || off != 3 {
		t.Fatalf("toCommit = %d %v, want 3 (nothing settled before 5)", off, ok)
	}
	tr.committedAt(3)
	if _, _, ok := tr.toCommit(); ok {
		t.Fatal("toCommit after committing the point: want nothing")
	}
}

// FuzzTracker settles entries in arbitrary order and checks the commit rule:
// the commit point never passes an unsettled entry and reaches the end when
// everything is settled.
func FuzzTracker(f *testing.F) {
	f.Add([]byte{3, 1, 2, 0, 9})
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{200, 17, 4, 4, 4, 99})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 {
			return
		}
		tr := newTracker()
		n := len(ops)
		es := make([]*entry, n)
		off := int64(0)
		for i := range es {
			off += 1 + int64(ops[i]%3) // holes like transaction markers
			es[i] = tr.add(off, 0, nil)
		}
		for _, b := range ops {
			e := es[int(b)%n]
			switch b % 4 {
			case 0:
				tr.nak(e)
			case 1:
				tr.redeliver(e)
			default:
				tr.settle(e)
			}
			// The commit point is at or below every unsettled offset.
			for _, x := range es {
				if x.state != stateSettled && tr.commitOff > x.off {
					t.Fatalf("commit point %d passes unsettled offset %d", tr.commitOff, x.off)
				}
			}
		}
		for _, e := range es {
			tr.redeliver(e)
			tr.settle(e)
		}
		if tr.commitOff != es[n-1].off+1 || tr.unsettled() != 0 || len(tr.q) != 0 {
			t.Fatalf("all settled: commit %d (want %d), unsettled %d, queue %d", tr.commitOff, es[n-1].off+1, tr.unsettled(), len(tr.q))
		}
	})
}
