package idem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/clocktest"
	"github.com/idem-dev/idem/memstore"
)

// manualClock moves only when the test advances it (see clocktest).
type manualClock = clocktest.Manual

func newManualClock() *manualClock { return clocktest.New() }

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
