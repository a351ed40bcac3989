package rocketbroker

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
)

// Defaults. docs/rocketbroker.md says where each comes from.
const (
	DefaultProducerGroup     = "idem-producer"
	DefaultSendTimeout       = 3 * time.Second  // seed 000: sendMessageTimeout=3000
	DefaultSendRetries       = 2                // seed 000: retryTimesWhenSendFailed=2
	DefaultMaxReconsumeTimes = 3                // seed 000: maxReconsumeTimes=3
	DefaultConsumeTimeout    = 15 * time.Minute // the client's (and the Java client's) consumeTimeout
	DefaultMaxInFlight       = 1024             // the consumer runtime's MaxInFlight
	DefaultPullBatchSize     = 32               // the client's pullBatchSize
)

// DefaultDelayLevels are the broker's default messageDelayLevel ("1s 5s
// 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"): level i+1 waits
// DefaultDelayLevels[i].
var DefaultDelayLevels = slices.Clone(remoting.DefaultDelayLevels)

// Client is how to reach the cluster; shared by PublisherConfig and
// SubscriberConfig.
type Client struct {
	// NameServers are the name servers' host:port. Required.
	NameServers []string
	// AccessKey and SecretKey are the ACL credentials, if the cluster
	// uses ACLs.
	AccessKey, SecretKey string
	// Logger receives the adapter's own logs. Default slog.Default(). The
	// client library's logs go to one process-wide logger: see
	// SetClientLogger.
	Logger *slog.Logger
}

func (c Client) withDefaults() Client {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Client) validate() []error {
	var errs []error
	if len(c.NameServers) == 0 {
		errs = append(errs, errors.New("no NameServers"))
	}
	for _, a := range c.NameServers {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("name server %q: %w", a, err))
		}
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		errs = append(errs, errors.New("AccessKey and SecretKey go together"))
	}
	return errs
}

// PublisherConfig configures a Publisher. Synchronous sends (a nil error
// only on SEND_OK) are not configurable.
type PublisherConfig struct {
	Client
	// Group is the producer group. Default "idem-producer".
	Group string
	// SendTimeout bounds one send attempt (when the caller's context
	// allows that long). Default 3s (seed 000).
	SendTimeout time.Duration
	// Retries is how many times the client sends again after a failed
	// attempt (a transport error or a retryable broker code). Default 2
	// (seed 000); -1 for none. A retry after a lost answer stores a
	// duplicate: RocketMQ has no server-side dedup (consumers dedup by
	// message id).
	Retries int
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	c.Client = c.Client.withDefaults()
	if c.Group == "" {
		c.Group = DefaultProducerGroup
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	switch {
	case c.Retries == 0:
		c.Retries = DefaultSendRetries
	case c.Retries < 0:
		c.Retries = 0
	}
	return c
}

// Validate reports a configuration error, wrapping idem.ErrInvalidArgument.
func (c PublisherConfig) Validate() error {
	errs := c.Client.validate()
	if c.SendTimeout < 0 {
		errs = append(errs, errors.New("negative SendTimeout"))
	}
	if c.Retries < -1 {
		errs = append(errs, errors.New("Retries must be -1 (none) or >= 0"))
	}
	// The Java client refuses such producer group names at start
	// (Validators.checkGroup: topic characters, at most 255 bytes); the
	// Go client would send them.
	switch {
	case len(c.Group) > 255:
		errs = append(errs, fmt.Errorf("Group is %d bytes, over 255", len(c.Group)))
	case c.Group != "":
		if err := remoting.CheckChars(c.Group); err != nil {
			errs = append(errs, fmt.Errorf("Group: %w", err))
		}
	}
	return invalid(errs)
}

// TermPolicy is what Acker.Term does with a delivery.
type TermPolicy int

const (
	// TermDeadLetter sends the message to the group's dead-letter topic
	// %DLQ%<group> (a send-back with delay level -1; in orderly mode, a
	// suspend past the reconsume maximum): nothing the consumer
	// terminates is lost. The default.
	TermDeadLetter TermPolicy = iota
	// TermAck consumes it (ConsumeSuccess): for a consumer that
	// dead-letters messages itself (consumer.Config.DeadLetter), so that
	// each poison message is kept once.
	TermAck
)

// StartFrom is where a consumer group seen for the first time starts.
type StartFrom int

const (
	// StartFromFirst reads each queue from its first retained message
	// (CONSUME_FROM_FIRST_OFFSET): a new group sees what was published
	// before it started. The default.
	StartFromFirst StartFrom = iota
	// StartFromLast starts at the end of each queue
	// (CONSUME_FROM_LAST_OFFSET, the client's default).
	StartFromLast
)

// SubscriberConfig configures a Subscriber: a push consumer in clustering
// mode for one consumer group.
type SubscriberConfig struct {
	Client
	// Group is the consumer group. Required.
	Group string
	// Topics are subscribed with the tag expression "*". At least one.
	Topics []string
	// MaxReconsumeTimes is the client's maxReconsumeTimes: a message
	// nak'ed that many times goes to %DLQ%<group> on its next nak, so it
	// is delivered at most MaxReconsumeTimes+1 times (MaxDeliveries;
	// +2 in orderly mode). Default 3 (seed 000); -1 for the client's
	// default (16 concurrently; unlimited in orderly mode).
	MaxReconsumeTimes int
	// Orderly consumes each queue in order, one message at a time
	// (ConsumeOrderly, queue locks on the broker); a nak suspends the
	// queue for the nak's delay (SuspendCurrentQueueAMoment).
	Orderly bool
	// MaxInFlight is how many deliveries may be outstanding (handed to
	// Fetch or waiting for it, not settled) per subscribed topic and for
	// the retry topic: the client's ConsumeGoroutineNums, since each
	// outstanding delivery holds one consume goroutine until it is
	// settled. Default 1024 (the consumer runtime's MaxInFlight).
	MaxInFlight int
	// ConsumeTimeout is the client's consumeTimeout: a message in a
	// consume callback for longer is sent back to the retry topic (a
	// copy, one reconsume counted) and its offset released. Acker.
	// InProgress restarts the clock. Default 15m.
	ConsumeTimeout time.Duration
	// PullBatchSize is how many messages one pull asks for. Default 32.
	PullBatchSize int
	// MaxSpan is the client's consumeConcurrentlyMaxSpan: a queue whose
	// cached messages span more offsets than this (its lowest unsettled
	// message and its newest pulled one) is not pulled from until it
	// shrinks; it also bounds what a crash makes the group's next member
	// consume again (the committed offset cannot pass a queue's lowest
	// unsettled message). Default 2000 (the client's), at least
	// 2 x MaxInFlight when that is larger.
	MaxSpan int
	// DelayLevels must be the broker's messageDelayLevel: Nak(delay)
	// uses the smallest level of at least delay (the largest caps it).
	// Default DefaultDelayLevels.
	DelayLevels []time.Duration
	// Term is what Acker.Term does. Default TermDeadLetter.
	Term TermPolicy
	// StartFrom is where a new group starts. Default StartFromFirst.
	StartFrom StartFrom
	// StartRetry is the wait between attempts to start the consumer while
	// the name server cannot be reached or the topic has no route.
	// Default 1s.
	StartRetry time.Duration
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	c.Client = c.Client.withDefaults()
	if c.MaxReconsumeTimes == 0 {
		c.MaxReconsumeTimes = DefaultMaxReconsumeTimes
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.ConsumeTimeout == 0 {
		c.ConsumeTimeout = DefaultConsumeTimeout
	}
	if c.PullBatchSize == 0 {
		c.PullBatchSize = DefaultPullBatchSize
	}
	if c.MaxSpan == 0 {
		c.MaxSpan = min(65535, max(2000, 2*c.MaxInFlight))
	}
	if len(c.DelayLevels) == 0 {
		c.DelayLevels = DefaultDelayLevels
	}
	if c.StartRetry == 0 {
		c.StartRetry = time.Second
	}
	return c
}

// Validate reports a configuration error, wrapping idem.ErrInvalidArgument.
func (c SubscriberConfig) Validate() error {
	errs := c.Client.validate()
	if c.Group == "" {
		errs = append(errs, errors.New("no Group"))
	} else if err := checkName(c.Group); err != nil {
		errs = append(errs, fmt.Errorf("Group: %w", err))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("no Topics"))
	}
	for _, t := range c.Topics {
		if err := checkName(t); err != nil {
			errs = append(errs, fmt.Errorf("topic: %w", err))
		}
	}
	if c.MaxReconsumeTimes < -1 {
		errs = append(errs, errors.New("MaxReconsumeTimes must be -1 (the client's default) or >= 1"))
	}
	if c.MaxInFlight < 0 || c.MaxInFlight > math.MaxInt32 {
		errs = append(errs, errors.New("MaxInFlight out of range"))
	}
	if c.ConsumeTimeout < 0 || c.StartRetry < 0 {
		errs = append(errs, errors.New("negative ConsumeTimeout or StartRetry"))
	}
	if c.MaxSpan < 0 || c.MaxSpan > 65535 {
		errs = append(errs, fmt.Errorf("MaxSpan %d not in [1, 65535]", c.MaxSpan))
	}
	if c.PullBatchSize < 0 || c.PullBatchSize > 1024 {
		errs = append(errs, fmt.Errorf("PullBatchSize %d not in [1, 1024]", c.PullBatchSize))
	}
	if !slices.IsSorted(c.DelayLevels) {
		errs = append(errs, errors.New("DelayLevels not in increasing order"))
	}
	for _, d := range c.DelayLevels {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("DelayLevels: %s < 1ms", d))
		}
	}
	if c.Term != TermDeadLetter && c.Term != TermAck {
		errs = append(errs, fmt.Errorf("unknown Term policy %d", c.Term))
	}
	if c.StartFrom != StartFromFirst && c.StartFrom != StartFromLast {
		errs = append(errs, fmt.Errorf("unknown StartFrom %d", c.StartFrom))
	}
	return invalid(errs)
}

// checkName applies the broker's rules for topic and group names; the
// %RETRY% and %DLQ% names are the broker's own.
func checkName(s string) error {
	if strings.HasPrefix(s, remoting.RetryTopicPrefix) || strings.HasPrefix(s, remoting.DLQTopicPrefix) {
		return fmt.Errorf("%q: %%RETRY%% and %%DLQ%% names are the broker's", s)
	}
	return remoting.CheckName(s)
}

// reconsumeLimit is the client's effective maximum: -1 means 16
// concurrently and unlimited in orderly mode.
func (c SubscriberConfig) reconsumeLimit() int {
	c = c.withDefaults()
	if c.MaxReconsumeTimes < 0 {
		if c.Orderly {
			return math.MaxInt32
		}
		return 16
	}
	return c.MaxReconsumeTimes
}

// MaxDeliveries is how many times a message is delivered at most before
// the broker moves it to %DLQ%<group> on its next nak: MaxReconsumeTimes+1
// concurrently (the broker dead-letters a send-back whose reconsume times
// reached the maximum), MaxReconsumeTimes+2 in orderly mode (the client
// dead-letters once they exceed it). 0 (no limit) in orderly mode with
// MaxReconsumeTimes -1.
func (c SubscriberConfig) MaxDeliveries() int {
	n := c.reconsumeLimit()
	if c.Orderly {
		if n == math.MaxInt32 {
			return 0
		}
		return n + 2
	}
	return n + 1
}

// RedeliveryWindow is the longest the broker may keep bringing a message
// back: each of its MaxDeliveries deliveries may be held up to
// ConsumeTimeout before the client sends it back (when nothing reports it
// in progress), and each redelivery waits at most the largest delay level.
// Unbounded without a delivery limit. See docs/rocketbroker.md.
func (c SubscriberConfig) RedeliveryWindow() time.Duration {
	c = c.withDefaults()
	n := c.MaxDeliveries()
	if n == 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(n)*c.ConsumeTimeout + time.Duration(n-1)*c.DelayLevels[len(c.DelayLevels)-1]
}

// DelayLevel is the delay level Nak(d) uses: the smallest level whose
// delay is at least d (level 1 for d <= 0), else the largest.
func (c SubscriberConfig) DelayLevel(d time.Duration) int {
	c = c.withDefaults()
	for i, l := range c.DelayLevels {
		if l >= d {
			return i + 1
		}
	}
	return len(c.DelayLevels)
}

func invalid(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: rocketbroker: %w", idem.ErrInvalidArgument, errors.Join(errs...))
}
