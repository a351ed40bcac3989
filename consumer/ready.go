package consumer

import (
	"context"

	"github.com/idem-dev/idem/broker"
)

// WaitReady reports whether the consumer's subscriber can deliver, for a
// readiness probe or a start-up that waits for its broker: the
// subscriber's broker.Readier (connected, its durable consumer, queue or
// group membership in place), nil at once for a subscriber without that
// capability. It returns nil at once when ready, even with ctx done, so a
// probe may call it with a short or expired context; otherwise the
// subscriber's error when ctx ends (ctx's, naming what it waits for).
// Run need not be running; Run itself waits for a subscriber that is not
// ready (its Fetch waits).
func (c *Consumer) WaitReady(ctx context.Context) error {
	if r, ok := c.cfg.Subscriber.(broker.Readier); ok {
		return r.WaitReady(ctx)
	}
	return nil
}
