package consumer

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idem-dev/idem/broker"
)

// Hooks observe a Consumer (metrics, tracing, alerts). Each field is
// optional; nil fields are skipped. Hooks run inline on the goroutine that
// settles the delivery and must be fast and must not block. A hook that
// panics is logged with its stack and otherwise ignored. The message
// they get must not be modified or kept after the hook returns.
//
// Counters that need no event (currently held deliveries, for a gauge) are
// in Consumer.Stats.
type Hooks struct {
	// OnAck observes each Ack: the effect is durable (handled now, or a
	// duplicate of one handled before).
	OnAck func(ctx context.Context, e AckEvent)
	// OnNak observes each Nak: the message goes back to the broker.
	OnNak func(ctx context.Context, e NakEvent)
	// OnHold observes a delivery the consumer keeps instead of handing it
	// back (store unavailable, last broker delivery, failing dead-letter
	// publish), and each retry of it that fails again.
	OnHold func(ctx context.Context, e HoldEvent)
	// OnDeadLetter observes each dead-lettering: published, terminated
	// without a publisher, or a publish that failed (Err set; the message
	// is held and retried).
	OnDeadLetter func(ctx context.Context, e DeadLetterEvent)
	// OnUnrecorded observes a message acked although the store did not
	// record its completion (idem.ErrUnrecorded): the effect is done; a
	// redelivery after the claim's lease lapsed could run it again unless
	// the guard's background completion records it first.
	OnUnrecorded func(ctx context.Context, e UnrecordedEvent)
}

// AckEvent describes one Ack.
type AckEvent struct {
	Msg       *broker.Message
	Duplicate bool // the key was already done: the handler did not run
}

// NakEvent describes one Nak.
type NakEvent struct {
	Msg    *broker.Message
	Delay  time.Duration
	Reason string
}

// HoldReason says why a delivery is held.
type HoldReason uint8

const (
	// HoldStoreUnavailable: a claim, release or completion could not
	// reach the store. Retried (one probe at a time while the store is
	// down) until the store answers.
	HoldStoreUnavailable HoldReason = iota + 1
	// HoldHandlerUnavailable: the handler's error was classified
	// unavailable or unknown outcome (its database or another system
	// could not be reached). The claim, if any, is kept; the handler runs
	// again later without spending an attempt.
	HoldHandlerUnavailable
	// HoldDeliveryLimit: the message would have been nak'ed on its last
	// broker delivery (broker.DeliveryLimiter); it is retried in process.
	HoldDeliveryLimit
	// HoldDeadLetter: publishing to the dead-letter topic failed.
	HoldDeadLetter
)

func (r HoldReason) String() string {
	switch r {
	case HoldStoreUnavailable:
		return "store_unavailable"
	case HoldHandlerUnavailable:
		return "handler_unavailable"
	case HoldDeliveryLimit:
		return "delivery_limit"
	case HoldDeadLetter:
		return "dead_letter"
	}
	return "unknown"
}

// HoldEvent describes a delivery being held, or a retry of a held delivery
// that failed again.
type HoldEvent struct {
	Msg    *broker.Message
	Reason HoldReason
	Err    error
	Retry  int           // 0 when the delivery is first held, then 1, 2, ...
	Wait   time.Duration // until the next retry
}

// DeadLetterEvent describes one dead-lettering.
type DeadLetterEvent struct {
	Msg    *broker.Message
	Reason string
	// Topic is the dead-letter topic published to; empty when the message
	// was terminated without a publish (no DeadLetter publisher configured,
	// or MissingKeyReject).
	Topic string
	// Err is set when the publish failed: the message is held and the
	// publish retried.
	Err error
}

// UnrecordedEvent describes a message acked with its completion
// unrecorded.
type UnrecordedEvent struct {
	Msg *broker.Message
	Key []byte
	Err error
}

// recovering returns c with every user function the runtime calls outside
// the handler's own recovery (hooks, ClassifyError, DeadLetterTopic)
// wrapped so that a panic is logged with its stack and does not reach a
// worker's goroutine (where it would crash the process with messages
// claimed and unsettled): a hook's panic is ignored, a classifier's leaves
// the error unclassified (the failure counts an attempt), a dead-letter
// topic function's gives the default topic. Batch.GroupBy is recovered
// where it is called: that message fails (see claimAndRun). Key,
// Fingerprint and OrderKey are recovered where they are called (prepare).
func (c Config) recovering() Config {
	log := c.Logger
	h := &c.Hooks
	if f := h.OnAck; f != nil {
		h.OnAck = func(ctx context.Context, e AckEvent) { defer recovered(log, "Hooks.OnAck"); f(ctx, e) }
	}
	if f := h.OnNak; f != nil {
		h.OnNak = func(ctx context.Context, e NakEvent) { defer recovered(log, "Hooks.OnNak"); f(ctx, e) }
	}
	if f := h.OnHold; f != nil {
		h.OnHold = func(ctx context.Context, e HoldEvent) { defer recovered(log, "Hooks.OnHold"); f(ctx, e) }
	}
	if f := h.OnDeadLetter; f != nil {
		h.OnDeadLetter = func(ctx context.Context, e DeadLetterEvent) { defer recovered(log, "Hooks.OnDeadLetter"); f(ctx, e) }
	}
	if f := h.OnUnrecorded; f != nil {
		h.OnUnrecorded = func(ctx context.Context, e UnrecordedEvent) { defer recovered(log, "Hooks.OnUnrecorded"); f(ctx, e) }
	}
	if f := c.ClassifyError; f != nil {
		c.ClassifyError = func(err error) (out error) {
			defer func() {
				if r := recover(); r != nil {
					logPanic(log, "ClassifyError", r)
					out = err
				}
			}()
			return f(err)
		}
	}
	if f := c.DeadLetterTopic; f != nil {
		c.DeadLetterTopic = func(m *broker.Message) (topic string) {
			defer func() {
				if r := recover(); r != nil {
					logPanic(log, "DeadLetterTopic", r)
					topic = m.Topic + ".dead-letter"
				}
			}()
			return f(m)
		}
	}
	return c
}

// recovered, deferred around a user function, logs and swallows its panic.
func recovered(log *slog.Logger, name string) {
	if r := recover(); r != nil {
		logPanic(log, name, r)
	}
}

func logPanic(log *slog.Logger, name string, r any) {
	log.Error("consumer: user function panicked; recovered", "func", name, "panic", r, "stack", string(debug.Stack()))
}
