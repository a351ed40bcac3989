package idem_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

// manualClock is an idem.Clock that moves only when the test advances it.
// Shared by a memstore (which times leases with it) and a guard
// (idem.WithClock: the heartbeat beats when this clock says a claim is
// due), it makes a lease lapse only when the test moves time past it
// without a heartbeat in between. How slow the machine is changes how long
// such a test takes, never what it sees.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newManualClock() *manualClock { return &manualClock{t: time.Unix(1_800_000_000, 0)} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newMemClock is a memstore timed by clk.
func newMemClock(t testing.TB, clk idem.Clock) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// stepHeld advances clk by step, n times, while keys are held by a guard
// on clk. Before each step it waits until every key's lease at the store
// (read from s, timed by clk) ends more than step from now: only the
// heartbeat can make that happen, so a guard that does not extend a key in
// time makes the test fail at the hang guard, never a lease lapse under a
// slow machine. stop, when not nil, ends the stepping early (checked
// before each step and while waiting). After each step check runs.
func stepHeld(t *testing.T, clk *manualClock, s idem.Store, keys []string, step time.Duration, n int, stop func() bool, check func(i int)) {
	t.Helper()
	for i := 0; i < n; i++ {
		for _, k := range keys {
			waitUntil(t, "a heartbeat extending "+k, func() bool {
				if stop != nil && stop() {
					return true
				}
				r, err := s.Get(ctx, []byte(k))
				if err != nil && !errors.Is(err, idem.ErrNotFound) {
					t.Fatalf("get %s: %v", k, err)
				}
				return err == nil && r.LeaseUntil.Sub(clk.Now()) > step
			})
		}
		if stop != nil && stop() {
			return
		}
		clk.Advance(step)
		if check != nil {
			check(i)
		}
	}
}
