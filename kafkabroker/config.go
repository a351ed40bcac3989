package kafkabroker

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-dev/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Defaults. Session, rebalance and heartbeat timings are Kafka's own client
// defaults; the rest are chosen here (see docs/kafkabroker.md).
const (
	DefaultMaxMessageBytes   = 1 << 20
	DefaultSessionTimeout    = 45 * time.Second
	DefaultRebalanceTimeout  = 60 * time.Second
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultCommitInterval    = time.Second
	DefaultCommitTimeout     = 10 * time.Second
	DefaultMaxNakDelay       = 5 * time.Minute
	DefaultMaxUnsettled      = 10000
	DefaultRevokeDrain       = 2 * time.Second
	DefaultCloseTimeout      = 5 * time.Second
)

// PublisherConfig configures a Publisher. The reliability settings (acks=all,
// idempotent producer) are not configurable: they are what makes Publish's
// "acked" mean durable and producer retries duplicate-free.
type PublisherConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Topic is used for messages whose Topic is empty. Optional.
	Topic string
	// TransactionalID turns on the transactional producer: each Publish
	// call is one Kafka transaction, so read_committed consumers see all
	// of its messages or none. Publish calls are then serialised.
	TransactionalID string
	// MaxMessageBytes bounds one record batch (ProducerBatchMaxBytes); it
	// must not exceed the broker's message.max.bytes. Default 1 MiB.
	MaxMessageBytes int
	// CancelInFlight lets Publish's context (and RecordDeliveryTimeout in
	// ClientOpts) fail records already sent whose answer has not come
	// back. By default franz-go waits for their outcome however long that
	// takes, so that the idempotent producer's sequence stays intact and
	// its own retries never duplicate: Publish can then outlive its
	// context while the broker is unreachable. With CancelInFlight it
	// returns idem.ErrUnknownOutcome instead, and a publish repeated by
	// the caller may write the message twice (the consumer's guard
	// dedups it by id). Not allowed with TransactionalID.
	CancelInFlight bool
	// Logger receives franz-go's warnings and errors. Default slog.Default().
	Logger *slog.Logger
	// ClientOpts are extra franz-go options (SASL, TLS, dialer...). They
	// are applied first, so they cannot weaken acks or idempotence.
	ClientOpts []kgo.Opt
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a configuration error, wrapping idem.ErrInvalidArgument.
func (c PublisherConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	if c.MaxMessageBytes < 1024 {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d < 1024", c.MaxMessageBytes))
	}
	if c.CancelInFlight && c.TransactionalID != "" {
		errs = append(errs, errors.New("CancelInFlight with TransactionalID"))
	}
	return invalid(errs)
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Group is the consumer group. Required.
	Group string
	// Topics to consume. Required.
	Topics []string

	// SessionTimeout, RebalanceTimeout, HeartbeatInterval: Kafka's
	// session.timeout.ms, rebalance.timeout.ms, heartbeat.interval.ms.
	// A dead member's partitions move after SessionTimeout.
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration

	// CommitInterval is how often the settled prefix of each partition is
	// committed in the background. Commits also happen on revoke, on Close
	// and on Commit. Default 1s.
	CommitInterval time.Duration
	// CommitTimeout bounds one commit round-trip. Default 10s.
	CommitTimeout time.Duration
	// MaxNakDelay caps Nak's delay so RedeliveryWindow stays true; a
	// longer delay is shortened (the guard tells an early redelivery of
	// an in-progress key to wait again). Default 5m.
	MaxNakDelay time.Duration
	// MaxUnsettled bounds deliveries handed out or waiting for a nak
	// delay and not yet settled; Fetch blocks while it is reached
	// (backpressure). Default 10,000.
	MaxUnsettled int
	// RevokeDrain is how long a revoke waits for deliveries of the revoked
	// partitions that are with the handler to settle before committing
	// and giving the partitions up; later acks are ignored and the next
	// owner redelivers. 0 uses the default (2s); negative: do not wait.
	RevokeDrain time.Duration
	// ReadUncommitted also delivers records of open or aborted
	// transactions. Default false (read_committed).
	ReadUncommitted bool
	// StartAtEnd makes a group with no committed offset start at the end
	// of each partition instead of the beginning (default: beginning, so
	// nothing published before the group first joined is skipped).
	StartAtEnd bool
	// MaxMessageBytes is the largest record the subscriber must be able to
	// fetch (FetchMaxPartitionBytes). Default 1 MiB.
	MaxMessageBytes int
	// CloseTimeout bounds Close: its final commit and leaving the group.
	// A group stuck in a rebalance (a member that joined and never
	// synced) holds commits and the leave for up to RebalanceTimeout;
	// Close gives up after CloseTimeout instead, and what it could not
	// commit is redelivered to the partitions' next owner (the guard
	// answers those as duplicates). Default 5s.
	CloseTimeout time.Duration
	// Logger: default slog.Default().
	Logger *slog.Logger
	// ClientOpts are extra franz-go options, applied first: the options
	// this package needs (group, manual commits, callbacks, isolation)
	// override them.
	ClientOpts []kgo.Opt
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = min(DefaultHeartbeatInterval, c.SessionTimeout/3)
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultCommitTimeout
	}
	if c.MaxNakDelay == 0 {
		c.MaxNakDelay = DefaultMaxNakDelay
	}
	if c.MaxUnsettled == 0 {
		c.MaxUnsettled = DefaultMaxUnsettled
	}
	if c.RevokeDrain == 0 {
		c.RevokeDrain = DefaultRevokeDrain
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports a configuration error, wrapping idem.ErrInvalidArgument.
func (c SubscriberConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	if c.Group == "" {
		errs = append(errs, errors.New("no group"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("no topics"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SessionTimeout", c.SessionTimeout}, {"RebalanceTimeout", c.RebalanceTimeout},
		{"HeartbeatInterval", c.HeartbeatInterval}, {"CommitInterval", c.CommitInterval},
		{"CommitTimeout", c.CommitTimeout}, {"MaxNakDelay", c.MaxNakDelay}, {"CloseTimeout", c.CloseTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %s < 0", d.name, d.v))
		}
	}
	if c.HeartbeatInterval >= c.SessionTimeout {
		errs = append(errs, fmt.Errorf("HeartbeatInterval %s >= SessionTimeout %s", c.HeartbeatInterval, c.SessionTimeout))
	}
	if c.MaxUnsettled < 1 {
		errs = append(errs, fmt.Errorf("MaxUnsettled %d < 1", c.MaxUnsettled))
	}
	if c.MaxMessageBytes < 1024 {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d < 1024", c.MaxMessageBytes))
	}
	return invalid(errs)
}

// RedeliveryWindow is the longest an unsettled message can take to come back:
// a member that dies is noticed after SessionTimeout, the rebalance that
// follows may take RebalanceTimeout, the new owner starts from the last
// commit; a nak'd message waits up to MaxNakDelay; and a settled offset may
// wait CommitInterval+CommitTimeout before it is committed.
func (c SubscriberConfig) RedeliveryWindow() time.Duration {
	c = c.withDefaults()
	return c.SessionTimeout + c.RebalanceTimeout + c.MaxNakDelay + c.CommitInterval + c.CommitTimeout
}

func invalid(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: kafkabroker: %w", idem.ErrInvalidArgument, errors.Join(errs...))
}
