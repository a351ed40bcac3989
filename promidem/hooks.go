package promidem

import (
	"context"
	"errors"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/outbox"
)

// GuardHooks returns the hooks to pass to idem.WithHooks: claims by
// outcome, takeovers, settles, store errors and latencies, fail-open
// passes, lost leases and unrecorded completions.
func (c *Collector) GuardHooks() idem.Hooks {
	c.used[srcGuard].Store(true)
	return idem.Hooks{
		OnClaim:      c.onClaim,
		OnSettle:     c.onSettle,
		OnFailOpen:   func(context.Context, []byte, error) { c.failOpen.Inc() },
		OnLeaseLost:  func(context.Context, []byte, uint64, error) { c.leasesLost.Inc() },
		OnUnrecorded: c.onUnrecorded,
	}
}

const (
	opClaim = iota
	opComplete
	opRelease
	opFail
)

func (c *Collector) onClaim(_ context.Context, e idem.ClaimEvent) {
	c.storeDuration[opClaim].Observe(e.Duration.Seconds())
	o := claimOutcome(e)
	c.claims[o].Inc()
	switch {
	case o == outcomeError:
		c.storeErrors[opClaim][errorClass(e.Err)].Inc()
	case e.Outcome == idem.OutcomeAcquired && e.Attempts > 1:
		c.takeovers.Inc()
	}
}

const outcomeError = 6 // index of "error" in claimOutcomes

func claimOutcome(e idem.ClaimEvent) int {
	if e.Err != nil {
		switch {
		case errors.Is(e.Err, idem.ErrFingerprintMismatch):
			return 4
		case errors.Is(e.Err, idem.ErrInvalidKey), errors.Is(e.Err, idem.ErrInvalidArgument):
			return 5
		}
		return outcomeError
	}
	switch e.Outcome {
	case idem.OutcomeAcquired:
		return 0
	case idem.OutcomeCompleted:
		return 1
	case idem.OutcomeInProgress:
		return 2
	case idem.OutcomeFailed:
		return 3
	}
	return outcomeError // a store answering an outcome that does not exist
}

// errorClass indexes errorClasses. An unknown outcome is checked before
// unavailable: an error may wrap both, and the guard treats it as unknown.
func errorClass(err error) int {
	switch {
	case errors.Is(err, idem.ErrUnknownOutcome):
		return 1
	case errors.Is(err, idem.ErrUnavailable):
		return 0
	case errors.Is(err, idem.ErrCapacity):
		return 2
	case errors.Is(err, idem.ErrCorrupt):
		return 3
	case errors.Is(err, idem.ErrClosed):
		return 4
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return 5
	}
	return 6
}

func (c *Collector) onSettle(_ context.Context, e idem.SettleEvent) {
	a := int(e.Action) - 1
	if a < 0 || a >= len(settleActions) {
		return
	}
	op := opComplete + a
	c.storeDuration[op].Observe(e.Duration.Seconds())
	switch {
	case e.Err == nil:
		c.settles[a][0].Inc()
		if e.Held > 0 {
			c.holdDuration[a].Observe(e.Held.Seconds())
		}
	case errors.Is(e.Err, idem.ErrFenced):
		c.settles[a][1].Inc()
	case errors.Is(e.Err, idem.ErrNotFound):
		c.settles[a][2].Inc()
	default:
		c.settles[a][3].Inc()
		c.storeErrors[op][errorClass(e.Err)].Inc()
	}
}

func (c *Collector) onUnrecorded(_ context.Context, e idem.UnrecordedEvent) {
	if p := int(e.Phase) - 1; p >= 0 && p < len(unrecPhases) {
		c.unrecorded[p].Inc()
	}
}

// ConsumerHooks returns the hooks to set as consumer.Config.Hooks: acks
// (handled or duplicate), naks, holds, dead letters and unrecorded acks.
// Pass the consumer to WatchConsumer too for its in-flight and held
// gauges.
func (c *Collector) ConsumerHooks() consumer.Hooks {
	c.used[srcConsumer].Store(true)
	return consumer.Hooks{
		OnAck: func(_ context.Context, e consumer.AckEvent) {
			if e.Duplicate {
				c.acks[1].Inc()
			} else {
				c.acks[0].Inc()
			}
		},
		OnNak: func(context.Context, consumer.NakEvent) { c.naks.Inc() },
		OnHold: func(_ context.Context, e consumer.HoldEvent) {
			r := int(e.Reason) - 1
			if r < 0 || r >= len(holdReasons)-1 {
				r = len(holdReasons) - 1 // "other": a reason added after this module
			}
			if e.Retry == 0 {
				c.holds[r].Inc()
			} else {
				c.holdRetries[r].Inc()
			}
		},
		OnDeadLetter: func(_ context.Context, e consumer.DeadLetterEvent) {
			switch {
			case e.Err != nil:
				c.deadLetters[2].Inc()
			case e.Topic == "":
				c.deadLetters[1].Inc()
			default:
				c.deadLetters[0].Inc()
			}
		},
		OnUnrecorded: func(context.Context, consumer.UnrecordedEvent) { c.unrecordedAcks.Inc() },
	}
}

// OutboxHooks returns the hooks to set as outbox.Config.Hooks: messages
// published, publish time and commit-to-publish delay, retries, failures,
// the relay's own errors, and from its periodic stats the backlog, failed
// rows and the oldest pending age. One relay per Collector: the stats of
// the last snapshot are shown.
func (c *Collector) OutboxHooks() outbox.Hooks {
	c.used[srcOutbox].Store(true)
	return outbox.Hooks{
		OnPublished: func(_ context.Context, e outbox.PublishedEvent) {
			c.outboxPublished.Add(float64(len(e.Rows)))
			c.outboxPubDur.Observe(e.Duration.Seconds())
			for i := range e.Rows {
				if ca := e.Rows[i].CreatedAt; !ca.IsZero() {
					c.outboxDelay.Observe(max(e.At.Sub(ca).Seconds(), 0))
				}
			}
		},
		OnRetry:  func(context.Context, outbox.RetryEvent) { c.outboxRetries.Inc() },
		OnFailed: func(context.Context, outbox.FailedEvent) { c.outboxFailures.Inc() },
		OnStats: func(_ context.Context, s outbox.Stats) {
			c.mu.Lock()
			c.outbox.seen = true
			c.outbox.pending, c.outbox.failed = float64(s.Pending), float64(s.Failed)
			c.outbox.oldest = s.OldestAge().Seconds()
			c.mu.Unlock()
		},
		OnError: func(_ context.Context, op string, _ error) {
			i := len(outboxOps) - 1
			for j, o := range outboxOps[:len(outboxOps)-1] {
				if o == op {
					i = j
				}
			}
			c.outboxErrors[i].Inc()
		},
	}
}
