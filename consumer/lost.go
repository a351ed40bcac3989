package consumer

import (
	"context"
	"errors"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// Lost deliveries. An Acker call that returns broker.ErrDeliveryLost says
// the delivery can no longer be settled and the broker delivers it again
// (its connection closed, its partition was revoked...). The in-flight
// signaller's InProgress calls notice it for every delivery in hand,
// within InProgressInterval; a settle notices it too. From then on the
// consumer works for the redelivered copy only:
//
//   - not started yet (queued, waiting behind its order key, waiting for
//     the store before its claim): dropped, with no broker call;
//   - claimed, its handler not run yet or waiting to run again (held for
//     its handler's system, between in-process retries): the claim is
//     released, so the redelivered copy acquires the key at once instead
//     of waiting for the lease, and the delivery is dropped (no nak, no
//     dead letter, no hold on a last delivery: the broker has it);
//   - its handler running: it runs to its end (cancelling it could leave
//     half an effect); a success is completed as usual, which fences the
//     redelivered copy (answered as a duplicate), and a failure is not
//     retried: the claim is released and the delivery dropped;
//   - its effect done and its completion being recorded (a completion
//     hold): the completion goes on, for the same reason.
//
// A held delivery found lost is retried at once (its park is woken), so
// its claim and its MaxInFlight slot are let go without waiting for its
// next retry. Each lost delivery counts once in Stats.Lost and is logged
// at Info level.

// errLost is the release cause of a claim let go for a lost delivery.
var errLost = errors.New("consumer: delivery lost (broker.ErrDeliveryLost); the broker redelivers it")

func (d *delivery) isLost() bool { return d.lost.Load() }

// noteLost records that the broker reported x lost (err), once: it counts
// and logs it, and wakes the park holding x.
func (c *Consumer) noteLost(x *delivery, err error, where string) {
	if !x.lost.CompareAndSwap(false, true) {
		return
	}
	c.stats.lost.Add(1)
	c.log.Info("consumer: delivery lost; the broker delivers it again", "msg_id", x.m.ID, "delivery", x.m.Delivery, "noticed_by", where, "err", err)
	if p := x.parked.Load(); p != nil {
		p.lot.pushLost(p)
	}
}

// settleFailed reports whether a settle call's err is a failure to log:
// a lost delivery is counted as lost (not as a settle error) and is not.
func (c *Consumer) settleFailed(x *delivery, err error, call string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, broker.ErrDeliveryLost):
		c.noteLost(x, err, call)
		return false
	}
	c.stats.settleErrors.Add(1)
	return true
}

// letGo ends the lost delivery d without a broker call. Its followers
// (other deliveries of its key in its batch) that are not lost go back to
// the broker on their own.
func (c *Consumer) letGo(ctx context.Context, d *delivery) []*hold {
	if c.claim(d) {
		c.done(d)
	}
	fs := d.followers
	d.followers = nil
	var hs []*hold
	for _, f := range fs {
		// nakOrHold lets go of a follower lost itself (it has no followers).
		hs = append(hs, c.nakOrHold(ctx, f, 0, "the first delivery of its key in the batch was lost")...)
	}
	return hs
}

// lostClaimed lets go of the lost delivery d and of its claim, whose
// effect has not run (or failed): the release frees the key for the
// redelivered copy now rather than when the lease lapses.
func (c *Consumer) lostClaimed(ctx context.Context, d *delivery, held *idem.Held, cause error) []*hold {
	d.steps.releaseAll(ctx, cause)
	if err := held.Release(ctx, cause); err != nil && !errors.Is(err, idem.ErrFailed) {
		c.log.Info("consumer: release of a lost delivery's claim failed; the key is free once its lease lapses", "msg_id", d.m.ID, "err", err)
	}
	return c.letGo(ctx, d)
}

// liveOnly returns ds without its lost deliveries, which it lets go of.
func (c *Consumer) liveOnly(ctx context.Context, ds []*delivery) (live []*delivery, hs []*hold) {
	for i, d := range ds {
		if !d.isLost() {
			continue
		}
		live = append(live, ds[:i]...)
		for _, d := range ds[i:] {
			if d.isLost() {
				hs = append(hs, c.letGo(ctx, d)...)
			} else {
				live = append(live, d)
			}
		}
		return live, hs
	}
	return ds, nil
}

// lostIn reports whether a delivery of h was lost.
func (h *hold) lostIn() bool {
	for _, d := range h.ds {
		if d.isLost() {
			return true
		}
	}
	return false
}
