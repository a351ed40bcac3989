package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
)

// holdMany acquires n keys named k0000... on g and returns their claims.
func holdMany(t *testing.T, g *idem.Guard, n int) ([]*idem.Held, []string) {
	t.Helper()
	hs := make([]*idem.Held, n)
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("k%04d", i)
		h, _, err := g.Acquire(ctx, []byte(keys[i]))
		if err != nil || h == nil {
			t.Fatalf("acquire %s: %v", keys[i], err)
		}
		hs[i] = h
	}
	return hs, keys
}

const beatLease = 300 * time.Millisecond

// beatEnv is a guard with lease beatLease on a manual clock, over a
// faultstore (a BatchStore when batch) over memstore, with n keys held.
type beatEnv struct {
	g    *idem.Guard
	clk  *manualClock
	mem  *memstore.Store
	fs   *faultstore.Store
	hook *countHook
	hs   []*idem.Held
	keys []string
}

func newBeatEnv(t *testing.T, batch bool, n int) *beatEnv {
	t.Helper()
	e := &beatEnv{clk: newManualClock(), hook: &countHook{}}
	e.mem = newMemClock(t, e.clk)
	e.fs = faultstore.New(e.mem)
	var st idem.Store = e.fs
	if batch {
		st = e.fs.WithBatch()
	}
	e.g = newGuard(t, st, idem.WithLease(beatLease), idem.WithClock(e.clk), idem.WithHooks(e.hook.hooks()))
	e.hs, e.keys = holdMany(t, e.g, n)
	return e
}

// extended waits until the leases of the keys at idx (all when none) run
// a full lease from now, and the guard has taken in every answer.
func (e *beatEnv) extended(t *testing.T, idx ...int) {
	t.Helper()
	if idx == nil {
		idx = make([]int, len(e.keys))
		for i := range idx {
			idx[i] = i
		}
	}
	for _, i := range idx {
		waitUntil(t, "the lease of "+e.keys[i]+" moved", func() bool {
			r, err := e.mem.Get(ctx, []byte(e.keys[i]))
			return err == nil && r.LeaseUntil.Sub(e.clk.Now()) == beatLease
		})
	}
	waitUntil(t, "the heartbeat's answers taken in", func() bool { return idem.BeatsInFlight(e.g) == 0 })
}

// The soak's batch consumer held ~2,000 keys, and the heartbeat sent one
// Extend per key per interval: with a BatchExtender store, the claims due
// in a tick go out in calls of at most 256. On a manual clock every claim
// falls due in the same tick, so a round is exactly ceil(n/256) calls, and
// none is a single Extend.
func TestHeartbeatBatchesExtends(t *testing.T) {
	e := newBeatEnv(t, true, 600) // 256 + 256 + 88
	for round := 1; round <= 3; round++ {
		e.clk.Advance(beatLease / 2) // past the interval (lease/3), within the lease
		waitUntil(t, fmt.Sprintf("round %d of extends", round), func() bool {
			return e.fs.Calls(faultstore.OpExtendBatch) >= 3*round
		})
		e.extended(t)
		if b, x := e.fs.Calls(faultstore.OpExtendBatch), e.fs.Calls(faultstore.OpExtend); b != 3*round || x != 0 {
			t.Fatalf("round %d: %d batch calls and %d single extends so far, want %d and 0", round, b, x, 3*round)
		}
	}
	for _, h := range e.hs {
		select {
		case <-h.Done():
			t.Fatalf("claim %s lost", h.Key())
		default:
		}
		if err := h.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// A store without ExtendBatch still gets one Extend per claim.
func TestHeartbeatWithoutBatchExtender(t *testing.T) {
	e := newBeatEnv(t, false, 5) // a bare Store
	e.clk.Advance(beatLease / 2)
	e.extended(t)
	if x := e.fs.Calls(faultstore.OpExtend); x != 5 {
		t.Fatalf("%d extends, want 5", x)
	}
}

// One entry of a batch fenced (its key taken over elsewhere) or gone loses
// that claim alone; an entry failing otherwise is retried at the next tick,
// its claim kept; the rest of the batch is extended.
func TestHeartbeatBatchEntryErrors(t *testing.T) {
	e := newBeatEnv(t, true, 5)
	hs, keys := e.hs, e.keys
	// k0001 is taken over: released with its token and claimed again.
	if err := e.mem.Release(ctx, hs[1].Key(), hs[1].Token(), "test"); err != nil {
		t.Fatal(err)
	}
	if c, err := e.mem.Claim(ctx, idem.ClaimRequest{Key: hs[1].Key(), Lease: time.Hour, TTL: time.Hour}); err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("take over: %+v, %v", c, err)
	}
	// k0002 is gone; k0003's extends fail (a shard down) until cleared.
	if err := e.mem.Delete(ctx, hs[2].Key()); err != nil {
		t.Fatal(err)
	}
	e.fs.Inject(faultstore.OpExtendBatch, faultstore.Fault{Keys: func(k []byte) bool { return string(k) == keys[3] }})
	e.clk.Advance(beatLease / 2)
	waitUntil(t, "two claims lost", func() bool { return e.hook.lost.Load() >= 2 })
	<-hs[1].Done()
	<-hs[2].Done()
	e.fs.Clear()
	e.extended(t, 0, 3, 4)
	for _, i := range []int{0, 3, 4} {
		select {
		case <-hs[i].Done():
			t.Fatalf("claim %s lost", keys[i])
		default:
		}
	}
	if n := e.hook.lost.Load(); n != 2 {
		t.Fatalf("%d claims lost, want 2", n)
	}
	for _, i := range []int{0, 3, 4} {
		if err := hs[i].Complete(ctx, nil); err != nil {
			t.Fatalf("complete %s: %v", keys[i], err)
		}
	}
	for _, i := range []int{1, 2} {
		if err := hs[i].Complete(ctx, nil); !errors.Is(err, idem.ErrFenced) && !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("complete %s, lost: %v", keys[i], err)
		}
	}
}

// A batch call that fails as a whole loses nothing: every claim of it is
// extended at a later tick, and none is lost, whatever the error says.
func TestHeartbeatBatchCallFailureRetried(t *testing.T) {
	for _, ferr := range []error{idem.ErrUnavailable, idem.ErrUnknownOutcome, idem.ErrFenced, idem.ErrNotFound} {
		t.Run(ferr.Error(), func(t *testing.T) {
			e := newBeatEnv(t, true, 300)
			e.fs.Inject(faultstore.OpExtendBatch, faultstore.Fault{Err: ferr, Times: 2})
			e.clk.Advance(beatLease / 2)
			e.extended(t)
			// Two calls failed; the retries may split differently (a
			// claim is due again as soon as its failed call returns).
			if b, x := e.fs.Calls(faultstore.OpExtendBatch), e.fs.Calls(faultstore.OpExtend); b < 4 || x != 0 {
				t.Fatalf("%d batch calls and %d single extends, want at least 4 (2 failed, 2 retried) and 0", b, x)
			}
			if n := e.hook.lost.Load(); n != 0 {
				t.Fatalf("%d claims lost", n)
			}
			for _, h := range e.hs {
				if err := h.Complete(ctx, nil); err != nil {
					t.Fatalf("complete %s: %v", h.Key(), err)
				}
			}
		})
	}
}

// A store answering a batch with the wrong number of errors said something
// inconsistent: nothing is taken as extended or lost, and the claims are
// retried.
type shortExtend struct {
	idem.Store
	calls atomic.Int32 // ExtendBatch calls (the heartbeat's goroutines make them)
}

func (s *shortExtend) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	n := s.calls.Add(1)
	errs, err := s.Store.(idem.BatchExtender).ExtendBatch(ctx, es)
	if err != nil || n > 1 {
		return errs, err
	}
	for i := range errs {
		errs[i] = idem.ErrFenced
	}
	return errs[1:], nil
}

func TestHeartbeatBatchResultCountMismatch(t *testing.T) {
	clk := newManualClock()
	mem := newMemClock(t, clk)
	const lease = 300 * time.Millisecond
	var hook countHook
	st := &shortExtend{Store: mem}
	g := newGuard(t, st, idem.WithLease(lease), idem.WithClock(clk), idem.WithHooks(hook.hooks()))
	hs, _ := holdMany(t, g, 3)
	clk.Advance(lease / 2)
	stepHeld(t, clk, mem, []string{"k0000", "k0001", "k0002"}, lease/4, 4, nil, nil)
	// The heartbeat went through ExtendBatch (its first call gets the
	// short answer): a guard that never called it would pass the rest.
	if n := st.calls.Load(); n < 1 {
		t.Fatal("no ExtendBatch call: the short answer was never read")
	}
	if n := hook.lost.Load(); n != 0 {
		t.Fatalf("%d claims lost", n)
	}
	for _, h := range hs {
		if err := h.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
}
