package watermillidem

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/idem-dev/idem"
)

// KeyFunc returns a message's idempotency key. An error or an empty key
// sends the message down the poison path (ErrNoKey).
type KeyFunc func(*message.Message) ([]byte, error)

// FingerprintFunc returns what must be the same for two messages with one
// key to be the same message; nil turns the check off for that message.
type FingerprintFunc func(*message.Message) []byte

// ErrNoKey: the message has no usable key (an empty UUID, a missing
// metadata field, or one longer than idem.MaxKeyLen).
var ErrNoKey = errors.New("watermillidem: message has no idempotency key")

// MessageUUID is the default KeyFunc: the Watermill message UUID, which
// the producer fixes before the first publish (watermill.NewUUID(), or an
// id of its own), so every redelivery and every re-publish of the message
// carries it.
func MessageUUID(m *message.Message) ([]byte, error) {
	if m.UUID == "" {
		return nil, fmt.Errorf("%w: empty UUID", ErrNoKey)
	}
	return []byte(m.UUID), nil
}

// KeyFromMetadata keys messages on a metadata field, e.g. a business id
// ("order_id") that two different messages for one operation share.
func KeyFromMetadata(field string) KeyFunc {
	return func(m *message.Message) ([]byte, error) {
		v := m.Metadata.Get(field)
		if v == "" {
			return nil, fmt.Errorf("%w: metadata field %q missing or empty", ErrNoKey, field)
		}
		return []byte(v), nil
	}
}

// PayloadFingerprint is the default FingerprintFunc:
// idem.FingerprintOf(payload) (docs/fingerprint.md). The same key with
// another payload is then idem.ErrFingerprintMismatch, never a silent
// replay of another message's result.
func PayloadFingerprint(m *message.Message) []byte { return idem.FingerprintOf(m.Payload) }

// NoFingerprint turns the fingerprint check off.
func NoFingerprint(*message.Message) []byte { return nil }

// Defaults applied to zero Config fields.
const (
	DefaultRetryWait = time.Second
	DefaultHoldWait  = 5 * time.Second
)

// Config configures a Deduplicator.
type Config struct {
	// Guard is the idempotency guard (required): its store (memstore,
	// boltstore, redisstore, pgstore, mysqlstore...), lease, attempts
	// (idem.WithMaxAttempts: without it a message that always fails is
	// retried for ever, as Watermill does) and TTL.
	Guard *idem.Guard
	// Key defaults to MessageUUID.
	Key KeyFunc
	// Fingerprint defaults to PayloadFingerprint.
	Fingerprint FingerprintFunc
	// DeadLetter and DeadLetterTopic receive, exactly once per message, a
	// message that failed for good: its attempts used up or an
	// idem.Permanent error, a key reused with another payload, no key.
	// The copy carries Watermill's poison queue metadata (reason_poisoned,
	// topic_poisoned, handler_poisoned, subscriber_poisoned), and the
	// original is then acked. Without them such a message is nacked with an
	// error IsPoison recognises: put middleware.PoisonQueueWithFilter (with
	// IsPoison) outside this middleware, or Watermill redelivers it for
	// ever (each redelivery answered at once, without running the handler).
	DeadLetter      message.Publisher
	DeadLetterTopic string
	// NoReplay makes a duplicate of a completed message return no
	// messages. By default it returns the messages the first run produced
	// (stored with the record, same UUIDs), so the router publishes them
	// again: a first run whose outputs failed to publish after its record
	// was written loses nothing. Downstream handlers dedup them by UUID.
	NoReplay bool
	// RetryWait is the longest the middleware waits before nacking a
	// message whose key another worker holds (it waits for the holder's
	// remaining lease, at most this) or whose claim failed on a store
	// error. Watermill redelivers a nacked message at once on most
	// pub/subs: the wait keeps that from spinning. Default 1s.
	RetryWait time.Duration
	// HoldWait is the longest wait between runs of a handler whose error
	// says its system is unreachable (idem.ErrUnavailable /
	// ErrUnknownOutcome after classification): the message keeps its claim
	// and the handler runs again, spending no attempt, until it succeeds,
	// fails otherwise, the lease is lost or the message's context ends.
	// Default 5s (backoff from 100ms).
	HoldWait time.Duration
	// ClassifyError maps a handler's error onto idem's sentinels for an
	// effect in a system idem.ClassifyError and the guard's store do not
	// know (both are applied first).
	ClassifyError func(error) error
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports a bad configuration (wrapping idem.ErrInvalidArgument).
func (c Config) Validate() error {
	switch {
	case c.Guard == nil:
		return fmt.Errorf("%w: watermillidem: Config.Guard is required", idem.ErrInvalidArgument)
	case (c.DeadLetter == nil) != (c.DeadLetterTopic == ""):
		return fmt.Errorf("%w: watermillidem: DeadLetter and DeadLetterTopic go together", idem.ErrInvalidArgument)
	case c.RetryWait < 0, c.HoldWait < 0:
		return fmt.Errorf("%w: watermillidem: negative RetryWait or HoldWait", idem.ErrInvalidArgument)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Key == nil {
		c.Key = MessageUUID
	}
	if c.Fingerprint == nil {
		c.Fingerprint = PayloadFingerprint
	}
	if c.RetryWait == 0 {
		c.RetryWait = DefaultRetryWait
	}
	if c.HoldWait == 0 {
		c.HoldWait = DefaultHoldWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
