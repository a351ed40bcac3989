package chaos

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/internal/clocktest"
	"github.com/idem-dev/idem/memstore"
)

// TestJudgeRerun: which re-runs the check accepts. A re-run after a lost
// claim (the first holder's CompleteBatch came back ErrFenced after a
// store partition: h-chaosbatch's late-duplicate experiment, seed 72) is
// the documented dual-write window; the same process again, a loss found
// only after the completion was answered unrecorded with no unrecorded
// ack recorded (an ignored CompleteBatch error), or a second ledger row
// never is.
func TestJudgeRerun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		r       rerun
		faulted string
		rows    int
		want    rerunVerdict
	}{
		{"faulted holder", rerun{OldPid: 1, Pid: 2}, "sigkill", 1, rerunFault},
		{"faulted holder, same pid", rerun{OldPid: 1, Pid: 1}, "sigstop", 1, rerunFault},
		{"unrecorded ack, another process", rerun{OldPid: 1, Pid: 2, Unrecorded: true}, "", 1, rerunUnrecorded},
		{"unrecorded ack and then lost, another process", rerun{OldPid: 1, Pid: 2, Unrecorded: true, Lost: true, Pending: true}, "", 1, rerunUnrecorded},
		{"lost before completion, another process", rerun{OldPid: 1, Pid: 2, Lost: true}, "", 1, rerunLost},

		{"no fault, no record", rerun{OldPid: 1, Pid: 2}, "", 1, rerunBad},
		{"unrecorded ack, same process", rerun{OldPid: 1, Pid: 1, Unrecorded: true}, "", 1, rerunBad},
		{"lost, same process", rerun{OldPid: 1, Pid: 1, Lost: true}, "", 1, rerunBad},
		{"lost after its completion went to the background, no unrecorded ack", rerun{OldPid: 1, Pid: 2, Lost: true, Pending: true}, "", 1, rerunBad},
		{"pending only", rerun{OldPid: 1, Pid: 2, Pending: true}, "", 1, rerunBad},
		{"lost, but two ledger rows", rerun{OldPid: 1, Pid: 2, Lost: true}, "", 2, rerunBad},
		{"unrecorded, but two ledger rows", rerun{OldPid: 1, Pid: 2, Unrecorded: true}, "", 2, rerunBad},
		{"faulted, but two ledger rows", rerun{OldPid: 1, Pid: 2}, "sigkill", 2, rerunBad},
		{"lost, no ledger row", rerun{OldPid: 1, Pid: 2, Lost: true}, "", 0, rerunBad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := judgeRerun(tc.r, tc.faulted, tc.rows)
			if got != tc.want {
				t.Fatalf("judgeRerun(%+v, %q, %d) = %d (%s), want %d", tc.r, tc.faulted, tc.rows, got, why, tc.want)
			}
			if why == "" {
				t.Fatal("no reason given")
			}
		})
	}
}

// TestGuardEventsHooks: the worker's guard hooks queue a lost claim
// (taken over, its Complete or CompleteBatch refused with ErrFenced) with
// its token and no pending row, and a completion answered ErrUnrecorded
// as pending.
func TestGuardEventsHooks(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New() // the store's only: the guards keep the real one
	mem, err := memstore.New(memstore.Config{Clock: clock, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	fs := faultstore.New(mem)
	st := fs.WithBatch()
	// Not started (no ledger here): the test reads the queue.
	ev := &guardEvents{wake: make(chan struct{}, 1)}
	lost := 0
	newGuard := func(hooks ...idem.Hooks) *idem.Guard {
		g, err := idem.NewGuard(st, idem.WithLogger(quiet()), idem.WithLease(time.Second), idem.WithHooks(hooks...))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a := newGuard(ev.hooks(func() { lost++ }))
	defer a.Close()
	b := newGuard()
	defer b.Close()

	takenOver := func(key string) *idem.Held {
		t.Helper()
		h, _, err := a.Acquire(ctx, []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Second) // the store's lease lapses
		h2, _, err := b.Acquire(ctx, []byte(key))
		if err != nil || h2 == nil {
			t.Fatalf("takeover: %v", err)
		}
		defer h2.Complete(ctx, nil)
		return h
	}
	h := takenOver("single")
	if err := h.Complete(ctx, nil); !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("Complete after takeover: %v, want ErrFenced", err)
	}
	h = takenOver("batch")
	if errs := a.CompleteBatch(ctx, []*idem.Held{h}, nil); !errors.Is(errs[0], idem.ErrFenced) {
		t.Fatalf("CompleteBatch after takeover: %v, want ErrFenced", errs[0])
	}
	got := ev.take()
	if len(got) != 2 || lost != 2 {
		t.Fatalf("events %+v (%d lost), want 2 lost", got, lost)
	}
	for i, key := range []string{"single", "batch"} {
		if e := got[i]; e.table != "lost" || e.key != key || e.token == 0 || e.err == "" {
			t.Fatalf("event %d: %+v, want lost %q with its token", i, e, key)
		}
	}

	// Completions the store does not record within the lease: pending.
	fs.Inject(faultstore.OpComplete, faultstore.Fault{})
	fs.Inject(faultstore.OpCompleteBatch, faultstore.Fault{})
	h, _, err = a.Acquire(ctx, []byte("unrecorded"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Complete(ctx, nil); !errors.Is(err, idem.ErrUnrecorded) {
		t.Fatalf("Complete with the store down: %v, want ErrUnrecorded", err)
	}
	got = ev.take()
	if len(got) != 1 || got[0].table != "pending" || got[0].key != "unrecorded" || got[0].token != h.Token() {
		t.Fatalf("events %+v, want one pending for %q token %d", got, "unrecorded", h.Token())
	}
	fs.Clear()
}
