// Package clocktest has a clock for tests that moves only when the test
// advances it. Shared by a memstore and guards (idem.WithClock), it makes a
// lease lapse only when the test moves time past it without a heartbeat in
// between: how slow the machine is changes how long such a test takes,
// never what it sees.
package clocktest

import (
	"sync"
	"time"
)

// Manual is an idem.Clock that moves only on Advance.
type Manual struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a Manual clock at a fixed instant.
func New() *Manual { return &Manual{t: time.Unix(1_800_000_000, 0)} }

// Now returns the clock's time.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
