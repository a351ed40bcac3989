package e2etest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGenerate(t *testing.T) {
	for _, tc := range []struct {
		name             string
		from, to         int
		dupFrac          float64
		minDups, maxDups int
	}{
		{"no duplicates", 0, 2500, 0, 0, 0},
		{"20 percent", 0, 10_000, 0.2, 1800, 2200},
		{"offset range", 5000, 10_000, 0.2, 900, 1100},
		{"all duplicated", 0, 10, 1, 10, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var originals, dups []*broker.Message
			inBatch := map[string]bool{}
			Generate("tp", tc.from, tc.to, tc.dupFrac, func(o, d []*broker.Message) {
				if len(o) == 0 || len(o) > BatchSize {
					t.Fatalf("batch of %d", len(o))
				}
				clear(inBatch)
				for _, m := range o {
					inBatch[m.ID] = true
				}
				for _, m := range d {
					if !inBatch[m.ID] {
						t.Fatalf("duplicate %s is not from its batch", m.ID)
					}
				}
				originals = append(originals, o...)
				dups = append(dups, d...)
			})
			if len(originals) != tc.to-tc.from {
				t.Fatalf("%d originals, want %d", len(originals), tc.to-tc.from)
			}
			for k, m := range originals {
				i := tc.from + k
				if m.ID != ID(i) || string(m.Payload) != string(Payload(i)) || m.Topic != "tp" {
					t.Fatalf("original %d = %s %s on %s", k, m.ID, m.Payload, m.Topic)
				}
			}
			if len(dups) < tc.minDups || len(dups) > tc.maxDups {
				t.Fatalf("%d duplicates, want %d..%d", len(dups), tc.minDups, tc.maxDups)
			}
			var again []string
			Generate("tp", tc.from, tc.to, tc.dupFrac, func(_, d []*broker.Message) {
				for _, m := range d {
					again = append(again, m.ID)
				}
			})
			for i := range dups {
				if again[i] != dups[i].ID {
					t.Fatal("duplicates differ between runs with the same range")
				}
			}
		})
	}
}

// TestLedgerExactlyOnce: the verdict passes on a ledger holding each
// message once and names every way it can be wrong otherwise.
func TestLedgerExactlyOnce(t *testing.T) {
	const n = 2500
	for _, tc := range []struct {
		name  string
		extra []*broker.Message // appended after 0..n-1
		skip  int               // message left out (-1: none)
		want  string            // "" or part of the error
	}{
		{"exactly once", nil, -1, ""},
		{"duplicate", []*broker.Message{Message("x", 7)}, -1, "msg-0000007 x2"},
		{"missing", nil, 42, "1 of the 2500 ids are missing"},
		{"never published", []*broker.Message{Message("x", n)}, -1, "1 rows carry an id that was never published"},
		{"foreign payload", []*broker.Message{{ID: "msg-0000003", Payload: Payload(4)}}, 3, "1 rows carry another message's payload"},
		{"malformed id", []*broker.Message{{ID: "other", Payload: []byte("x")}}, -1, "never published"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(t, "idem_e2etest")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var msgs []*broker.Message
			Generate("x", 0, n, 0, func(o, _ []*broker.Message) {
				for _, m := range o {
					if m.ID != ID(tc.skip) {
						msgs = append(msgs, m)
					}
				}
			})
			// Both effects: most rows by batch, the extra ones one by one.
			if err := l.InsertBatch()(ctx, msgs); err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.extra {
				if _, err := l.Insert()(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			err := l.CheckExactlyOnce(ctx, n)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("CheckExactlyOnce = %v, want an error with %q", err, tc.want)
			}
			if tc.skip >= 0 && tc.extra == nil {
				if got := l.Missing(t, n, 10); len(got) != 1 || got[0] != tc.skip {
					t.Fatalf("Missing = %v, want [%d]", got, tc.skip)
				}
			}
		})
	}
}

type fakeAcker struct{ acks, naks, terms *int }

func (a fakeAcker) Ack(context.Context) error                { *a.acks++; return nil }
func (a fakeAcker) Nak(context.Context, time.Duration) error { *a.naks++; return nil }
func (a fakeAcker) Term(context.Context, string) error       { *a.terms++; return nil }
func (a fakeAcker) InProgress(context.Context) error         { return nil }

// fakeSub delivers n first deliveries per Fetch.
type fakeSub struct {
	broker.Subscriber // nil: only Fetch is called
	acker             fakeAcker
}

func (s *fakeSub) Fetch(_ context.Context, n int) ([]*broker.Message, error) {
	out := make([]*broker.Message, n)
	for i := range out {
		out[i] = &broker.Message{ID: ID(i), Delivery: 1, Acker: s.acker}
	}
	return out, nil
}

func TestChaosSub(t *testing.T) {
	var acks, naks, terms int
	cs := &ChaosSub{Subscriber: &fakeSub{acker: fakeAcker{&acks, &naks, &terms}}, NakEvery: 4}
	ctx := context.Background()
	msgs, err := cs.Fetch(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		_ = m.Acker.Ack(ctx)
	}
	if acks != 75 || naks != 25 || cs.Forced() != 25 {
		t.Fatalf("acks %d naks %d forced %d, want 75 25 25", acks, naks, cs.Forced())
	}
	later, _ := cs.Fetch(ctx, 3)
	cs.Crash()
	for _, m := range later {
		_ = m.Acker.Ack(ctx)
		_ = m.Acker.Nak(ctx, 0)
		_ = m.Acker.Term(ctx, "x")
	}
	if acks != 75 || naks != 25 || terms != 0 {
		t.Fatalf("a crashed subscriber settled: acks %d naks %d terms %d", acks, naks, terms)
	}
	if _, err := cs.Fetch(ctx, 1); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Fetch after Crash = %v, want ErrClosed", err)
	}
}

func TestWaitFor(t *testing.T) {
	calls := 0
	WaitFor(t, "three calls", time.Minute, func() (bool, string) {
		calls++
		return calls == 3, ""
	})
	if calls != 3 {
		t.Fatalf("%d calls", calls)
	}
}

// TestExplain: the ledger's rows say who wrote them (the claim's token,
// the delivery, the consumer, the process), and the evidence a failed run
// logs tells a duplicate's rows apart and lists what the guard and the
// consumers reported about its key, with the key's record.
func TestExplain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := NewLedger(t, "idem_e2etest")
	guard := NewGuard(t, OpenPGStore(t, l))
	// msg-0000001 claimed and released once: the consumer's claim is its
	// second (an event).
	h, _, err := guard.Acquire(ctx, []byte(ID(1)))
	if err != nil || h == nil {
		t.Fatalf("Acquire = %v, %v", h, err)
	}
	if err := h.Release(ctx, errors.New("test release")); err != nil {
		t.Fatal(err)
	}
	b, err := membroker.New(membroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := b.NewPublisher()
	Publish(t, p, p, "tp", 0, 3, 0)
	sub := b.NewSubscriber("tp", "g")
	_, stop := RunConsumer(t, l.ConsumerConfig(sub, guard, Single))
	l.WaitDistinct(t, "the 3 messages", 3)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	_ = sub.Close()
	_ = p.Close()

	var n int
	if err := l.Pool.QueryRow(ctx, `SELECT count(*) FROM `+l.Table+` WHERE token > 0 AND delivery = 1 AND member = 'c1' AND pid = $1`, pid).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d of 3 rows carry a token, delivery 1, consumer c1 and this process (err %v)", n, err)
	}
	// A second effect of msg-0000001 under another token, from c2.
	if _, err := l.Pool.Exec(ctx, `INSERT INTO `+l.Table+` (msg_id, payload, token, delivery, member, pid)
		SELECT msg_id, payload, token + 100, 2, 'c2', pid FROM `+l.Table+` WHERE msg_id = $1`, ID(1)); err != nil {
		t.Fatal(err)
	}
	l.ev.logger("c2").Warn("consumer: test warning", "msg_id", ID(1))
	got := l.explain(ctx)
	for _, want := range []string{
		"ledger: 4 rows, 3 distinct ids",
		"1 ids written more than once (1 extra rows): 0 under one claim token, 1 under several, 0 with a row without a token; 0 with two rows in one transaction; 1 written by more than one consumer, 0 by more than one process",
		ID(1) + ":\n",
		`delivery 1 consumer "c1"`,
		`delivery 2 consumer "c2"`,
		"(1 rows)",
		"record " + ID(1) + ": completed",
		"attempts 2",
		"events of " + ID(1) + ":",
		"guard: release token",
		"guard: claimed again (attempt 2)",
		"c2: WARN consumer: test warning msg_id=" + ID(1),
		"goroutines in idem's code, by stack",
		"ledger pool: ",
		"database sessions (all clients) by state and wait:\n    ",
		"    re-claim: 1\n",
		"    c2 WARN \"consumer: test warning\": 1\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("evidence lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, ID(0)+":") {
		t.Errorf("evidence lists a message written once:\n%s", got)
	}
}
