package snowflake_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/snowflake"
)

func memStore(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitUntil polls cond every 5ms for up to 10s (no timing assertion: the
// bound only stops a hung test).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeasedWorkersDistinct: generators leasing from one store get
// different worker ids until the layout's ids run out (ErrNoWorker); their
// ids never collide.
func TestLeasedWorkersDistinct(t *testing.T) {
	st := memStore(t)
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
	st := memStore(t)
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

// TestLeaseLostStopsGeneration: the worker's record is deleted while the
// generator is making ids (an operator, or a takeover after a long
// stall): the next heartbeat finds it gone, Next fails with
// idem.ErrLeaseLost from then on, and the hook reports it as permanent.
func TestLeaseLostStopsGeneration(t *testing.T) {
	st := memStore(t)
	lost := make(chan bool, 1)
	g := newGen(t, snowflake.Config{Store: st, Lease: 300 * time.Millisecond, Hooks: snowflake.Hooks{
		OnLeaseLost: func(w int64, permanent bool, err error) { lost <- permanent },
	}})
	key := []byte("idem-snowflake/default/worker/" + itoa(g.Worker()))
	if _, err := st.Get(context.Background(), key); err != nil {
		t.Fatalf("lease record: %v", err)
	}
	made := 0
	stop := make(chan struct{})
	var lastErr error
	done := make(chan struct{})
	go func() { // in-flight generation while the lease goes
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := g.Next(); err != nil {
				lastErr = err
				return
			}
			made++
		}
	}()
	time.Sleep(20 * time.Millisecond)
	if err := st.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if !<-lost {
		t.Fatal("lease loss reported as not permanent")
	}
	<-done
	close(stop)
	if made == 0 || !errors.Is(lastErr, idem.ErrLeaseLost) {
		t.Fatalf("made %d ids, then %v; want some ids then ErrLeaseLost", made, lastErr)
	}
	if _, err := g.Next(); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Next after loss: %v", err)
	}
}

// TestLeaseStoreDownStopsThenResumes: the store goes down; once the lease
// could have run out Next fails with idem.ErrLeaseLost (nobody can prove
// the worker id is still ours); when the store is back and the renewal
// shows nobody took over, ids flow again.
func TestLeaseStoreDownStopsThenResumes(t *testing.T) {
	fs := faultstore.New(memStore(t))
	var mu sync.Mutex
	var hooks []bool
	g := newGen(t, snowflake.Config{Store: fs, Lease: 300 * time.Millisecond, Hooks: snowflake.Hooks{
		OnLeaseLost: func(w int64, permanent bool, err error) { mu.Lock(); hooks = append(hooks, permanent); mu.Unlock() },
	}})
	next(t, g)
	fs.SetDown(true)
	waitUntil(t, "Next to fail while the store is down", func() bool {
		_, err := g.Next()
		if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("unexpected error %v", err)
		}
		return err != nil
	})
	if fs.Calls(faultstore.OpExtend) == 0 {
		t.Fatal("no renewal was attempted")
	}
	fs.SetDown(false)
	waitUntil(t, "ids after the store is back", func() bool { _, err := g.Next(); return err == nil })
	mu.Lock()
	defer mu.Unlock()
	if len(hooks) != 1 || hooks[0] {
		t.Fatalf("hook calls %v, want one non-permanent loss", hooks)
	}
}

func itoa(n int64) string { return snowflake.ID(n).String() }
