package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// DefaultMaxUnavailableHold is Config.MaxUnavailableHold's default.
const DefaultMaxUnavailableHold = time.Hour

// Handler runs one message's effect. It returns when the effect is durable;
// the []byte is stored with the record and replayed to duplicates. Return
// idem.Permanent(err) for an error no retry can fix: the message is
// dead-lettered at once.
type Handler func(ctx context.Context, m *broker.Message) ([]byte, error)

// BatchHandler runs the effect of the new messages of a batch (duplicates
// and messages in progress elsewhere are already filtered out). It returns
// nil when every effect is durable, a *PartialError naming the messages
// that failed (the effects of the others are durable), or any other error
// when nothing was done (e.g. its transaction rolled back).
type BatchHandler func(ctx context.Context, msgs []*broker.Message) error

// PartialError is a BatchHandler's report that some messages failed. Failed
// maps an index into the handler's msgs to its error.
type PartialError struct {
	Failed map[int]error
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("consumer: %d message(s) of the batch failed", len(e.Failed))
}

// MissingKeyPolicy is what happens to a message with no usable key.
type MissingKeyPolicy uint8

const (
	// MissingKeyDeadLetter publishes it to the dead-letter topic, then
	// terminates it (the default).
	MissingKeyDeadLetter MissingKeyPolicy = iota
	// MissingKeyReject terminates it without dead-lettering (logged at
	// error level): for topics where such a message is garbage.
	MissingKeyReject
)

// BatchFailurePolicy is what happens when a whole batch fails.
type BatchFailurePolicy uint8

const (
	// BatchRetry releases every key and naks every message with backoff;
	// once the messages have used MaxAttempts they are dead-lettered (the
	// default).
	BatchRetry BatchFailurePolicy = iota
	// BatchDeadLetter dead-letters the whole batch at the first failure
	// that in-process retries did not fix.
	BatchDeadLetter
)

// Backoff is an exponential backoff: Initial, then times Multiplier up to
// Max.
type Backoff struct {
	Initial    time.Duration // default 100ms
	Max        time.Duration // default 1m
	Multiplier float64       // default 2
}

// Delay is the wait before retry number n (0 is the first retry).
func (b Backoff) Delay(n int) time.Duration {
	d := float64(b.Initial)
	for range n {
		d *= b.Multiplier
		if d >= float64(b.Max) {
			return b.Max
		}
	}
	return min(time.Duration(d), b.Max)
}

// BatchConfig turns on batch mode when Handler is a BatchHandler.
type BatchConfig struct {
	// Size is the most messages per batch. Default 500.
	Size int
	// Wait is the longest a worker waits to fill a batch once it has one
	// message. Default 20ms.
	Wait time.Duration
	// GroupBy, if set, splits each batch's new messages by its result and
	// calls the handler once per group (e.g. per business key), so one
	// group's failure does not fail the others.
	GroupBy func(m *broker.Message) string
	// OnFailure is what happens to a batch that fails as a whole.
	OnFailure BatchFailurePolicy
	// SettleConcurrency bounds the goroutines completing a successful
	// batch's keys (the guard completes them one by one: a round trip
	// each on a networked store); one goroutine per 64 messages at most.
	// Default 8.
	SettleConcurrency int
}

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Subscriber is where messages come from (required).
	Subscriber broker.Subscriber
	// Guard decides which messages are new (required).
	Guard *idem.Guard
	// Exactly one of Handler, BatchHandler, TxHandler and TxBatchHandler
	// (the batch ones use Batch).
	Handler        Handler
	BatchHandler   BatchHandler
	TxHandler      TxHandler
	TxBatchHandler TxBatchHandler
	Batch          BatchConfig

	// ClassifyError, if set, maps a handler's error onto idem's sentinels
	// after the runtime's own classification (idem.ClassifyError, then the
	// guard's store's idem.ErrorClassifier), for effects in a system whose
	// errors neither knows: wrap idem.ErrUnavailable (not reached, nothing
	// applied) or idem.ErrUnknownOutcome (may have been applied), or return
	// the error unchanged. Errors classified either way hold the message
	// and retry it without spending an attempt.
	ClassifyError func(err error) error
	// Hooks observe acks, naks, holds, dead letters and unrecorded
	// completions (metrics).
	Hooks Hooks

	// Key extracts the idempotency key. Default MessageIDKey.
	Key KeyFunc
	// Fingerprint computes the payload fingerprint compared on every
	// claim. Default PayloadFingerprint; NoFingerprint turns it off.
	Fingerprint FingerprintFunc
	// OrderKey picks the worker: messages with equal order keys are
	// handled one at a time in delivery order. Default: Message.Key if set,
	// else the idempotency key.
	OrderKey func(m *broker.Message, key []byte) []byte

	// DeadLetter receives poison messages, messages with no usable key
	// (MissingKeyDeadLetter) and fingerprint mismatches. Without it they
	// are terminated and logged at error level.
	DeadLetter broker.Publisher
	// DeadLetterTopic names the dead-letter topic. Default: the message's
	// topic + ".dead-letter".
	DeadLetterTopic func(m *broker.Message) string
	MissingKey      MissingKeyPolicy

	// MaxAttempts is how many claims (deliveries that ran the handler) a
	// key gets before it is marked failed and dead-lettered. Default 5.
	// Claims that were never settled count too (the process died running
	// the handler, or handed the message back at shutdown): a claim that
	// finds more than MaxAttempts claims before it dead-letters the
	// message without running the handler, so a message that crashes its
	// process is not retried until the broker's delivery limit drops it.
	MaxAttempts int
	// InProcessRetries is how many times a failed handler is retried on
	// the spot, while the claim is held, before the message goes back to
	// the broker. Only waits up to InProcessMaxWait are spent in process;
	// longer backoffs become a broker Nak with that delay. Default 2.
	InProcessRetries int
	InProcessMaxWait time.Duration // default 1s
	Backoff          Backoff
	// StoreDownDelay bounds the wait between retries of a delivery held
	// because the store (or the handler's system) could not be reached, and
	// is how long fetching pauses after a store failure (fail closed:
	// nothing runs, nothing is acked, nothing is nak'ed). Default 5s.
	StoreDownDelay time.Duration
	// MaxUnavailableHold bounds how long one delivery is held, its claim
	// kept and no attempt spent, while its handler's error is classified
	// unavailable or unknown outcome (its database or another system
	// cannot be reached). Past it, that error counts as a failed attempt
	// like any other: the key is released and the message nak'ed with
	// backoff (held on its last broker delivery), and dead-lettered once
	// MaxAttempts are used up. Each new delivery starts its own window, so
	// an outage is ridden out without spending an attempt for up to this
	// long, and dead-letters a message after about MaxAttempts times it.
	// Default 1h; negative: hold for as long as the system stays
	// unavailable (a misclassified permanent error then holds the message
	// for ever).
	MaxUnavailableHold time.Duration

	// Workers run handlers; different order keys run in parallel. Default 16.
	Workers int
	// MaxInFlight bounds messages fetched but not yet settled; fetching
	// waits when it is reached (backpressure). Default 1024.
	MaxInFlight int
	// FetchBatch is the most messages asked for in one Fetch. Default 256.
	FetchBatch int
	// InProgressInterval is how often the broker is told a delivery is
	// still being worked on (Acker.InProgress): from its fetch until it is
	// settled, while it waits for a worker, while its handler runs, while
	// its completion is recorded and while it is held, so the broker does
	// not redeliver it. A delivery is signalled between one and 1.25
	// intervals after the last signal: keep it under half the broker's ack
	// wait. Default 10s; negative disables it.
	InProgressInterval time.Duration
	// ShutdownTimeout bounds the drain after Run's context ends: messages
	// already fetched are handled and settled within it; held ones are
	// handed back at once; what is left after it is handed back too (a
	// nak, or a dead letter for a message on its last broker delivery).
	// A handler still running then has its context cancelled: an effect
	// that committed before the call returned the context's error may run
	// again elsewhere, as after a crash, unless it is transactional or
	// fenced by the token. Size it for a full drain. Default 30s.
	ShutdownTimeout time.Duration

	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Key == nil {
		c.Key = MessageIDKey
	}
	if c.Fingerprint == nil {
		c.Fingerprint = PayloadFingerprint
	}
	if c.OrderKey == nil {
		c.OrderKey = func(m *broker.Message, key []byte) []byte {
			if len(m.Key) > 0 {
				return m.Key
			}
			return key
		}
	}
	if c.DeadLetterTopic == nil {
		c.DeadLetterTopic = func(m *broker.Message) string { return m.Topic + ".dead-letter" }
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.InProcessRetries == 0 {
		c.InProcessRetries = 2
	}
	if c.InProcessMaxWait == 0 {
		c.InProcessMaxWait = time.Second
	}
	if c.Backoff.Initial == 0 {
		c.Backoff.Initial = 100 * time.Millisecond
	}
	if c.Backoff.Max == 0 {
		c.Backoff.Max = time.Minute
	}
	if c.Backoff.Multiplier == 0 {
		c.Backoff.Multiplier = 2
	}
	if c.StoreDownDelay == 0 {
		c.StoreDownDelay = 5 * time.Second
	}
	if c.MaxUnavailableHold == 0 {
		c.MaxUnavailableHold = DefaultMaxUnavailableHold
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 1024
	}
	if c.FetchBatch == 0 {
		c.FetchBatch = 256
	}
	if c.InProgressInterval == 0 {
		c.InProgressInterval = 10 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.Batch.Size == 0 {
		c.Batch.Size = 500
	}
	if c.Batch.Wait == 0 {
		c.Batch.Wait = 20 * time.Millisecond
	}
	if c.Batch.SettleConcurrency == 0 {
		c.Batch.SettleConcurrency = 8
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a configuration New would reject.
func (c Config) Validate() error {
	var errs []error
	if c.Subscriber == nil {
		errs = append(errs, errors.New("Subscriber is required"))
	}
	if c.Guard == nil {
		errs = append(errs, errors.New("Guard is required"))
	}
	handlers := 0
	for _, set := range []bool{c.Handler != nil, c.BatchHandler != nil, c.TxHandler != nil, c.TxBatchHandler != nil} {
		if set {
			handlers++
		}
	}
	if handlers != 1 {
		errs = append(errs, errors.New("set exactly one of Handler, BatchHandler, TxHandler and TxBatchHandler"))
	}
	if c.MaxAttempts < 0 || c.InProcessRetries < 0 || c.Workers < 0 || c.MaxInFlight < 0 ||
		c.FetchBatch < 0 || c.Batch.Size < 0 || c.Batch.SettleConcurrency < 0 {
		errs = append(errs, errors.New("MaxAttempts, InProcessRetries, Workers, MaxInFlight, FetchBatch, Batch.Size and Batch.SettleConcurrency must not be negative"))
	}
	if c.InProcessMaxWait < 0 || c.StoreDownDelay < 0 || c.ShutdownTimeout < 0 || c.Batch.Wait < 0 ||
		c.Backoff.Initial < 0 || c.Backoff.Max < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if c.Backoff.Multiplier != 0 && c.Backoff.Multiplier < 1 {
		errs = append(errs, errors.New("Backoff.Multiplier must be >= 1"))
	}
	if c.Backoff.Max > 0 && c.Backoff.Initial > c.Backoff.Max {
		errs = append(errs, errors.New("Backoff.Initial exceeds Backoff.Max"))
	}
	if c.MissingKey > MissingKeyReject {
		errs = append(errs, errors.New("unknown MissingKey policy"))
	}
	if c.Batch.OnFailure > BatchDeadLetter {
		errs = append(errs, errors.New("unknown Batch.OnFailure policy"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consumer: invalid config: %w", err)
	}
	return nil
}
