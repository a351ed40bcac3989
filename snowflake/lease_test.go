package snowflake_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/internal/clocktest"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/snowflake"
)

// memStore is a memstore on clk (nil: the system clock); on a manual clock
// a lease in it runs out only when the test advances the clock.
func memStore(t testing.TB, clk idem.Clock) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestLeasedWorkersDistinct: generators leasing from one store get
// different worker ids until the layout's ids run out (ErrNoWorker); their
// ids never collide.
func TestLeasedWorkersDistinct(t *testing.T) {
	st := memStore(t, nil)
	l := snowflake.Layout{TimeBits: 50, WorkerBits: 3, SequenceBits: 10} // 8 workers
	var gens []*snowflake.Generator
	workers := map[int64]bool{}
	for range 8 {
		g := newGen(t, snowflake.Config{Layout: l, Store: st})
		if workers[g.Worker()] {
			t.Fatalf("worker %d leased twice", g.Worker())
		}
		workers[g.Worker()] = true
		gens = append(gens, g)
	}
	if _, err := snowflake.New(context.Background(), snowflake.Config{Layout: l, Store: st}); !errors.Is(err, snowflake.ErrNoWorker) {
		t.Fatalf("ninth generator: %v, want ErrNoWorker", err)
	}
	seen := map[snowflake.ID]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, g := range gens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5000 {
				id, err := g.Next()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[id] {
					t.Errorf("duplicate id %d", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// TestLeaseHandoffStartsAfterLastID: Close releases the worker id with the
// last millisecond used; the next holder of that worker id, whose clock is
// behind it, makes no id at or below the old holder's last one (it waits
// the small step out).
func TestLeaseHandoffStartsAfterLastID(t *testing.T) {
	st := memStore(t, nil)
	l := snowflake.Layout{TimeBits: 53, WorkerBits: 0, SequenceBits: 10} // one worker id
	clk := &scriptClock{}
	base := time.Now().Add(time.Hour)
	clk.set(base, 0)
	g1 := newGen(t, snowflake.Config{Layout: l, Store: st, Clock: clk})
	var last snowflake.ID
	for range 10 {
		last = next(t, g1)
	}
	if err := g1.Close(); err != nil {
		t.Fatal(err)
	}
	// The new holder's clock reads 20ms earlier and runs 1ms per read.
	clk.set(base.Add(-20*time.Millisecond), time.Millisecond)
	g2 := newGen(t, snowflake.Config{Layout: l, Store: st, Clock: clk})
	if g2.Worker() != g1.Worker() {
		t.Fatalf("worker %d, want the released %d", g2.Worker(), g1.Worker())
	}
	if id := next(t, g2); id <= last {
		t.Fatalf("new holder made %d, not above the old holder's last %d", id, last)
	}
}

// TestLeaseHandoffFloorOutlivesOldGenerator: the floor a closing generator
// leaves in its released worker record is kept for LeaseRetention after the
// release, also when the generator ran longer than LeaseRetention. The
// record's retention was set by the claim and only raised to the lease by
// the heartbeats, so the floor of a generator older than LeaseRetention
// (any long-running service) went a lease after its release: a next holder
// of the worker id whose clock is behind then made ids the old holder had
// made already, which a consumer's guard takes for duplicates of other
// messages (lost messages). Manual clocks and heartbeat, as below.
func TestLeaseHandoffFloorOutlivesOldGenerator(t *testing.T) {
	clk := clocktest.New()
	st := memStore(t, clk)
	l := snowflake.Layout{TimeBits: 53, WorkerBits: 0, SequenceBits: 10} // one worker id
	const lease, retention = 300 * time.Millisecond, 10 * time.Second
	cfg := snowflake.Config{Layout: l, Store: st, Clock: clk, Lease: lease, LeaseRetention: retention}
	g1 := newGen(t, snowflake.ManualHeartbeat(cfg))
	for elapsed := time.Duration(0); elapsed < 2*retention; elapsed += lease / 3 {
		clk.Advance(lease / 3)
		if !snowflake.Beat(g1) {
			t.Fatal("renewal failed")
		}
	}
	last := next(t, g1)
	if err := g1.Close(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * lease) // well within LeaseRetention of the release
	// The next holder's clock reads a second behind the old holder's.
	behind := clocktest.New()
	behind.Advance(clk.Now().Sub(behind.Now()) - time.Second)
	cfg.Clock = behind
	g2 := newGen(t, snowflake.ManualHeartbeat(cfg))
	if id, err := g2.Next(); err == nil && id <= last {
		t.Fatalf("new holder made %d, not above the old holder's last %d: the floor was gone", id, last)
	} else if err != nil && !errors.Is(err, snowflake.ErrClockBackwards) {
		t.Fatalf("new holder's Next: %v, want an id above %d or ErrClockBackwards", err, last)
	}
}

// hookLog records OnLeaseLost calls (permanent or not).
type hookLog struct {
	mu    sync.Mutex
	calls []bool
}

func (h *hookLog) hooks() snowflake.Hooks {
	return snowflake.Hooks{OnLeaseLost: func(w int64, permanent bool, err error) {
		h.mu.Lock()
		h.calls = append(h.calls, permanent)
		h.mu.Unlock()
	}}
}

func (h *hookLog) get() []bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bool(nil), h.calls...)
}

// TestLeaseLostStopsGeneration: the worker's record is deleted while the
// generator is making ids (an operator, or a takeover after a long
// stall): the next heartbeat finds it gone, Next fails with
// idem.ErrLeaseLost from then on, and the hook reports it as permanent.
// The generator and the store share a manual clock and the test runs the
// heartbeat (snowflake.Beat): no lease lapses on its own however slow the
// machine is.
func TestLeaseLostStopsGeneration(t *testing.T) {
	clk := clocktest.New()
	st := memStore(t, clk)
	var hl hookLog
	g := newGen(t, snowflake.ManualHeartbeat(snowflake.Config{Store: st, Clock: clk, Lease: 300 * time.Millisecond, Hooks: hl.hooks()}))
	key := []byte("idem-snowflake/default/worker/" + itoa(g.Worker()))
	if _, err := st.Get(context.Background(), key); err != nil {
		t.Fatalf("lease record: %v", err)
	}
	next(t, g)
	if !snowflake.Beat(g) || len(hl.get()) != 0 {
		t.Fatalf("a renewal of a held lease stopped the generator (hooks %v)", hl.get())
	}
	// In-flight generation while the lease goes: up to 4,000 ids (the clock
	// stands still and a millisecond holds 4,096), stopping at the first
	// error, which must be the loss.
	var lastErr error
	made := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 4000 {
			if _, err := g.Next(); err != nil {
				lastErr = err
				return
			}
			made++
		}
	}()
	if err := st.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if snowflake.Beat(g) {
		t.Fatal("heartbeat after the record was deleted: lease not reported lost")
	}
	<-done
	if lastErr != nil && !errors.Is(lastErr, idem.ErrLeaseLost) {
		t.Fatalf("in-flight Next after %d ids: %v, want ErrLeaseLost or no error", made, lastErr)
	}
	if _, err := g.Next(); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Next after loss: %v", err)
	}
	if h := hl.get(); len(h) != 1 || !h[0] {
		t.Fatalf("hook calls %v, want one permanent loss", h)
	}
}

// TestLeaseStoreDownStopsThenResumes: the store goes down; a failed
// renewal alone does not stop ids, but once the lease could have run out
// Next fails with idem.ErrLeaseLost (nobody can prove the worker id is
// still ours); when the store is back and the renewal shows nobody took
// over, ids flow again. Manual clock and heartbeat as above.
func TestLeaseStoreDownStopsThenResumes(t *testing.T) {
	clk := clocktest.New()
	fs := faultstore.New(memStore(t, clk))
	var hl hookLog
	const lease = 300 * time.Millisecond
	g := newGen(t, snowflake.ManualHeartbeat(snowflake.Config{Store: fs, Clock: clk, Lease: lease, Hooks: hl.hooks()}))
	next(t, g)
	fs.SetDown(true)
	clk.Advance(lease / 3)
	if !snowflake.Beat(g) {
		t.Fatal("a failed renewal while the store is down ended the lease for good")
	}
	if fs.Calls(faultstore.OpExtend) == 0 {
		t.Fatal("no renewal was attempted")
	}
	next(t, g) // within the lease: still ours
	// The lease is trusted for 9/10 of its span from when the last
	// renewal (here the claim) was sent.
	clk.Advance(lease*9/10 - lease/3)
	if _, err := g.Next(); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Next once the lease could have run out: %v, want ErrLeaseLost", err)
	}
	if h := hl.get(); len(h) != 1 || h[0] {
		t.Fatalf("hook calls %v, want one non-permanent loss", h)
	}
	// Down past the lease in the store too; more failed renewals report
	// nothing new.
	clk.Advance(time.Second)
	if !snowflake.Beat(g) {
		t.Fatal("a failed renewal while the store is down ended the lease for good")
	}
	if _, err := g.Next(); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Next while the store is still down: %v, want ErrLeaseLost", err)
	}
	fs.SetDown(false)
	if !snowflake.Beat(g) {
		t.Fatal("renewal after the store came back: lease lost")
	}
	next(t, g)
	if h := hl.get(); len(h) != 1 || h[0] {
		t.Fatalf("hook calls %v, want one non-permanent loss", h)
	}
}

func itoa(n int64) string { return snowflake.ID(n).String() }
