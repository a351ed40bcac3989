package streamsbroker

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/redis/go-redis/v9"
)

// Defaults applied to zero config fields.
const (
	DefaultDedupWindow   = 2 * time.Minute
	DefaultTimeout       = 30 * time.Second
	DefaultAckWait       = 30 * time.Second
	DefaultMaxDeliver    = 20
	DefaultClaimInterval = time.Second
	DefaultPollWait      = 200 * time.Millisecond
	DefaultTrimInterval  = 30 * time.Second
	// ConsumerExpiry: the periodic trim also deletes a group's consumers
	// that hold no pending entry and have not read for this long (what
	// crashed or restarted subscribers leave behind). Deleting one that is
	// alive costs nothing: its next read creates it again.
	ConsumerExpiry = 10 * time.Minute
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Client is a *redis.Client, a *redis.ClusterClient or a failover
	// client (required). The caller owns it. The publisher never lets
	// go-redis re-send its XADD script (whatever MaxRetries says): a lost
	// reply is idem.ErrUnknownOutcome. Re-publishing the same id is then
	// safe within DedupWindow.
	Client redis.UniversalClient
	// DedupWindow: a message whose id was published to the same stream
	// within it is not added again; Publish returns as if it had been
	// (like JetStream's Nats-Msg-Id window). Each id costs a small key
	// with this TTL in the stream's hash slot. Default 2m.
	DedupWindow time.Duration
	// NoDedup adds every publish, even of an id just published. Tests use
	// it to make duplicates reach the consumer; the guard still catches
	// them.
	NoDedup bool
	// MaxLen, when > 0, refuses a publish to a stream that already holds
	// MaxLen entries or more (ErrStreamFull, which wraps
	// idem.ErrCapacity): backpressure instead of XADD MAXLEN, which would
	// drop the oldest entries whether or not they were consumed. The count
	// includes acked entries the subscribers' trim has not removed yet.
	MaxLen int64
	// Timeout bounds a Publish whose ctx has no deadline. Default 30s.
	Timeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports a bad configuration (wrapping idem.ErrInvalidArgument).
func (c PublisherConfig) Validate() error {
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: streamsbroker: PublisherConfig.Client is required", idem.ErrInvalidArgument)
	case c.DedupWindow < 0, c.Timeout < 0, c.MaxLen < 0:
		return fmt.Errorf("%w: streamsbroker: negative DedupWindow, Timeout or MaxLen", idem.ErrInvalidArgument)
	case c.DedupWindow > 0 && c.DedupWindow < time.Millisecond:
		return fmt.Errorf("%w: streamsbroker: DedupWindow under a millisecond", idem.ErrInvalidArgument)
	}
	if _, ok := c.Client.(*redis.Ring); ok {
		return fmt.Errorf("%w: streamsbroker: *redis.Ring is not supported (it shards keys client side; a stream and its dedup keys must share a node)", idem.ErrInvalidArgument)
	}
	return nil
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// SubscriberConfig configures a Subscriber: one consumer of a consumer
// group on one stream.
type SubscriberConfig struct {
	// Client is a *redis.Client, a *redis.ClusterClient or a failover
	// client (required). The caller owns it.
	Client redis.UniversalClient
	// Stream is the stream's key (required). A name with braces must have a
	// non-empty hash tag ({...}); see DeadLetterStream.
	Stream string
	// Group is the consumer group (required), created at the first Fetch
	// if missing, at the start of the stream (StartAtEnd: at its end).
	Group string
	// Consumer is this subscriber's name in the group. Default
	// "<hostname>-<pid>-<random>": unique per subscriber, so a restarted
	// process does not inherit a dead one's entries (the group reclaims
	// them after AckWait).
	Consumer string
	// AckWait: an entry delivered and neither settled nor kept alive with
	// InProgress within it is redelivered (to any consumer of the group,
	// by XAUTOCLAIM). It is also the longest Nak delay. Default 30s.
	AckWait time.Duration
	// MaxDeliver bounds deliveries per entry: one whose MaxDeliver-th
	// delivery stays unsettled past AckWait is moved to the dead-letter
	// stream (DeadLetterStream) and acked instead of being delivered
	// again. Default 20; -1 unlimited (RedeliveryWindow is then
	// unbounded).
	MaxDeliver int
	// ClaimInterval is how often Fetch looks for entries idle past AckWait
	// (and nak'ed ones that are due). Default 1s.
	ClaimInterval time.Duration
	// PollWait is the longest one blocking read (XREADGROUP BLOCK) waits
	// for new entries. A blocking read cannot be interrupted, so it is also
	// how late Fetch may return after its context ends, and how long Close
	// may wait for a Fetch in progress. Default 200ms; at most
	// ClaimInterval. An idle subscriber makes one read per PollWait.
	PollWait time.Duration
	// TrimInterval is how often Fetch trims the entries every group has
	// acked (and deletes long-idle consumers that hold nothing).
	// Default 30s; -1 never (the stream then keeps every entry until
	// someone trims it).
	TrimInterval time.Duration
	// StartAtEnd makes a group created by this subscriber start after the
	// last entry (XGROUP CREATE ... $) instead of at the first one.
	StartAtEnd bool
	// AckSync makes Ack wait for Redis's reply to its XACK. Off by
	// default: Ack queues the entry id and returns, and a flusher sends
	// queued acks in one XACK (the per-message round trip otherwise bounds
	// a consumer to one ack per round trip per worker). A lost ack only
	// causes a redelivery, which the guard answers as a duplicate; Close
	// sends what is queued.
	AckSync bool
	// DeadLetterOnTerm makes Term copy the entry to the dead-letter stream
	// with its reason, in the same script as its XACK. Off by default: the
	// consumer runtime publishes its own dead letters before it
	// terminates.
	DeadLetterOnTerm bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports a bad configuration (wrapping idem.ErrInvalidArgument).
func (c SubscriberConfig) Validate() error {
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: streamsbroker: SubscriberConfig.Client is required", idem.ErrInvalidArgument)
	case c.Group == "":
		return fmt.Errorf("%w: streamsbroker: SubscriberConfig.Group is required", idem.ErrInvalidArgument)
	case c.AckWait < 0, c.ClaimInterval < 0, c.PollWait < 0:
		return fmt.Errorf("%w: streamsbroker: negative AckWait, ClaimInterval or PollWait", idem.ErrInvalidArgument)
	case c.PollWait > 0 && c.PollWait < time.Millisecond:
		return fmt.Errorf("%w: streamsbroker: PollWait under a millisecond", idem.ErrInvalidArgument)
	case c.AckWait > 0 && c.AckWait < 10*time.Millisecond:
		return fmt.Errorf("%w: streamsbroker: AckWait %s under 10ms", idem.ErrInvalidArgument, c.AckWait)
	case c.ClaimInterval > 0 && c.ClaimInterval < time.Millisecond:
		return fmt.Errorf("%w: streamsbroker: ClaimInterval under a millisecond", idem.ErrInvalidArgument)
	case c.TrimInterval < -1:
		return fmt.Errorf("%w: streamsbroker: TrimInterval must be -1 (never) or >= 0", idem.ErrInvalidArgument)
	case c.MaxDeliver < -1:
		return fmt.Errorf("%w: streamsbroker: MaxDeliver must be -1 (unlimited) or >= 0", idem.ErrInvalidArgument)
	}
	if _, ok := c.Client.(*redis.Ring); ok {
		return fmt.Errorf("%w: streamsbroker: *redis.Ring is not supported (it shards keys client side)", idem.ErrInvalidArgument)
	}
	_, err := slotPrefix(c.Stream)
	return err
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.ClaimInterval == 0 {
		c.ClaimInterval = DefaultClaimInterval
	}
	if c.PollWait == 0 {
		c.PollWait = DefaultPollWait
	}
	c.PollWait = min(c.PollWait, c.ClaimInterval)
	if c.TrimInterval == 0 {
		c.TrimInterval = DefaultTrimInterval
	}
	if c.Consumer == "" {
		c.Consumer = consumerName()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// RedeliveryWindow is the longest an entry can keep being redelivered: each
// of its MaxDeliver deliveries may stay unsettled for AckWait and wait up
// to ClaimInterval more for a reclaim (a Nak's delay is at most AckWait,
// so it fits in the same bound). Unbounded with MaxDeliver -1.
func (c SubscriberConfig) RedeliveryWindow() time.Duration {
	c = c.withDefaults()
	if c.MaxDeliver < 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(c.MaxDeliver) * (c.AckWait + c.ClaimInterval)
}

func consumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// ErrStreamFull: the stream holds PublisherConfig.MaxLen entries or more;
// nothing was added. It wraps idem.ErrCapacity.
var ErrStreamFull = fmt.Errorf("streamsbroker: stream full (%w)", idem.ErrCapacity)

// ErrDeliveryLost: InProgress on a delivery that is no longer this
// consumer's (it stayed idle past AckWait and was reclaimed, or acked
// elsewhere). The message has been or will be delivered again. It wraps
// broker.ErrDeliveryLost.
var ErrDeliveryLost = fmt.Errorf("streamsbroker: the entry was reclaimed or settled elsewhere (%w)", broker.ErrDeliveryLost)
