package rabbitbroker

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Defaults. docs/rabbitbroker.md says where each comes from.
const (
	DefaultExchange        = "idem"
	DefaultExchangeType    = "direct"
	DefaultDeliveryLimit   = 20
	DefaultPrefetch        = 1024
	DefaultConsumerTimeout = 30 * time.Minute // RabbitMQ's consumer_timeout
	DefaultHeartbeat       = 10 * time.Second
	DefaultPublishTimeout  = 30 * time.Second
	DefaultDialTimeout     = 10 * time.Second
)

// DefaultDelayBuckets are the delays Nak(delay) rounds up to: one delay
// queue per bucket used.
var DefaultDelayBuckets = []time.Duration{
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute,
}

// Backoff is the wait between reconnection attempts: Initial, times
// Multiplier after each failure, at most Max, with up to 20% jitter.
// Default 1s x1.5 up to 10s (seed 000's retry policy).
type Backoff struct {
	Initial    time.Duration
	Multiplier float64
	Max        time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = time.Second
	}
	if b.Multiplier == 0 {
		b.Multiplier = 1.5
	}
	if b.Max == 0 {
		b.Max = 10 * time.Second
	}
	return b
}

func (b Backoff) validate() []error {
	var errs []error
	if b.Initial < 0 || b.Max < 0 {
		errs = append(errs, errors.New("negative Reconnect backoff"))
	}
	if b.Multiplier != 0 && b.Multiplier < 1 {
		errs = append(errs, fmt.Errorf("Reconnect.Multiplier %v < 1", b.Multiplier))
	}
	return errs
}

// Conn is how to reach the broker; shared by PublisherConfig and
// SubscriberConfig.
type Conn struct {
	// URL is the AMQP URI, e.g. amqp://guest:guest@127.0.0.1:5672/.
	// Required.
	URL string
	// Name is the connection name shown by the broker (rabbitmqctl
	// list_connections user_provided_name). Default "idem-publisher" /
	// "idem-subscriber:<queue>".
	Name string
	// Heartbeat is the AMQP heartbeat (negotiated: the server's when it
	// asks for less). The client sends a frame every half of it and takes
	// the server for dead after 1.5 of it without a frame (amqp091's read
	// deadline of three half-intervals); RabbitMQ drops a client silent
	// for two. Default 10s.
	Heartbeat time.Duration
	// DialTimeout bounds one TCP connect and handshake. Default 10s.
	DialTimeout time.Duration
	// Reconnect is the wait between attempts to (re)connect.
	Reconnect Backoff
	// AMQP is the client configuration to start from (TLS, SASL, vhost,
	// channel max...). Heartbeat, Dial and the connection name are set
	// here; Recovery must be nil: this package reconnects itself, so that
	// no delivery tag of a dead channel is ever used on a new one.
	AMQP amqp.Config
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Conn) withDefaults(name string) Conn {
	if c.Name == "" {
		c.Name = name
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	c.Reconnect = c.Reconnect.withDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Conn) validate() []error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("no URL"))
	} else if _, err := amqp.ParseURI(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("URL: %w", err))
	}
	if c.Heartbeat < 0 || c.DialTimeout < 0 {
		errs = append(errs, errors.New("negative Heartbeat or DialTimeout"))
	}
	if c.AMQP.Recovery != nil {
		errs = append(errs, errors.New("AMQP.Recovery must be nil (the adapter reconnects itself)"))
	}
	return append(errs, c.Reconnect.validate()...)
}

// PublisherConfig configures a Publisher. Publisher confirms, persistent
// messages and mandatory routing are not configurable: they are what makes
// Publish's nil mean "stored in every queue it routes to".
type PublisherConfig struct {
	Conn
	// Exchange receives every message, with Message.Topic as the routing
	// key. It is declared (durable) on every connection. Default "idem".
	Exchange string
	// ExchangeType: direct (default), topic, fanout or headers. It must
	// match the type the subscribers declare.
	ExchangeType string
	// Timeout bounds the wait for one Publish call's confirms when its
	// context has no deadline (and the wait for a connection). Default
	// 30s.
	Timeout time.Duration
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	c.Conn = c.Conn.withDefaults("idem-publisher")
	if c.Exchange == "" {
		c.Exchange = DefaultExchange
	}
	if c.ExchangeType == "" {
		c.ExchangeType = DefaultExchangeType
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultPublishTimeout
	}
	return c
}

// Validate reports a configuration error, wrapping idem.ErrInvalidArgument.
func (c PublisherConfig) Validate() error {
	errs := c.Conn.validate()
	if c.Timeout < 0 {
		errs = append(errs, errors.New("negative Timeout"))
	}
	errs = append(errs, checkExchange(c.Exchange, c.ExchangeType)...)
	return invalid(errs)
}

// maxName is AMQP's limit on queue and exchange names (a shortstr).
const maxName = 255

// predeclared are the exchanges every broker has; any other amq.* name is
// refused by the broker (ACCESS_REFUSED: reserved prefix).
var predeclared = []string{"amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"}

// checkName refuses what the broker would refuse to declare: a name in
// the reserved amq. namespace (other than a predeclared exchange) or
// longer than 255 bytes. Without it the subscriber would log the broker's
// refusal and retry for ever.
func checkName(what, name string, exchange bool) error {
	switch {
	case len(name) > maxName:
		return fmt.Errorf("%s %.20q... is %d bytes, over AMQP's %d", what, name, len(name), maxName)
	case strings.HasPrefix(name, "amq.") && !(exchange && slices.Contains(predeclared, name)):
		return fmt.Errorf("%s %q: the amq. prefix is reserved by the broker", what, name)
	}
	return nil
}

// checkExchange checks an exchange name and type ("" for the defaults):
// the type is one AMQP defines, or a plugin's (x-...).
func checkExchange(name, typ string) []error {
	var errs []error
	if err := checkName("Exchange", name, true); err != nil {
		errs = append(errs, err)
	}
	switch typ {
	case "", amqp.ExchangeDirect, amqp.ExchangeTopic, amqp.ExchangeFanout, amqp.ExchangeHeaders:
	default:
		if !strings.HasPrefix(typ, "x-") {
			errs = append(errs, fmt.Errorf("ExchangeType %q: not direct, topic, fanout, headers or a plugin's x- type", typ))
		}
	}
	return errs
}

// TermPolicy is what Acker.Term does with a delivery.
type TermPolicy int

const (
	// TermDeadLetter rejects the delivery without requeue: the broker
	// moves it to the queue's dead-letter exchange (and so to the
	// dead-letter queue), or drops it when there is none. The default:
	// nothing the consumer terminates is lost.
	TermDeadLetter TermPolicy = iota
	// TermAck acks the delivery: for a consumer that dead-letters
	// messages itself (consumer.Config.DeadLetter) into the queue's
	// dead-letter queue, so that each is there exactly once.
	TermAck
)

// SubscriberConfig configures a Subscriber: one queue (the consumer group)
// bound to the exchange, its dead-letter exchange and queue, and the delay
// queues Nak(delay) uses.
type SubscriberConfig struct {
	Conn
	// Queue is the work queue, i.e. the consumer group: every subscriber
	// of one queue shares its messages. Required.
	Queue string
	// Exchange and ExchangeType as in PublisherConfig (declared here too).
	Exchange     string
	ExchangeType string
	// Topics are the routing keys the queue is bound with (binding keys:
	// patterns on a topic exchange). At least one.
	Topics []string

	// Classic declares a classic queue instead of a quorum queue (and
	// classic delay and dead-letter queues). Classic queues count no
	// deliveries (Message.Delivery is 1, or 2 once redelivered) and have
	// no delivery limit; see docs/rabbitbroker.md.
	Classic bool
	// DeliveryLimit is the quorum queue's x-delivery-limit: a message
	// returned that many times (nak, requeue, channel closed while it was
	// unacked) is dead-lettered by the broker on its next return; so it is
	// delivered at most DeliveryLimit+1 times (MaxDeliveries). Default 20;
	// -1 for none. Ignored (none) with Classic.
	DeliveryLimit int
	// DeadLetterExchange receives what the queue dead-letters (Term,
	// DeliveryLimit); declared as a fanout exchange bound to
	// DeadLetterQueue. Default Queue+".dlx"; NoDeadLetter for none.
	DeadLetterExchange string
	// DeadLetterQueue is bound to DeadLetterExchange. Default Queue+".dlq".
	DeadLetterQueue string
	// NoDeadLetter declares the queue without a dead-letter exchange: a
	// terminated message or one over the delivery limit is dropped.
	NoDeadLetter bool
	// Term is what Acker.Term does. Default TermDeadLetter.
	Term TermPolicy
	// Prefetch is the channel's basic.qos prefetch count: how many
	// unacked deliveries the broker hands this subscriber at most (the
	// in-flight bound). Default 1024.
	Prefetch int
	// SingleActiveConsumer declares the queue with
	// x-single-active-consumer: one subscriber of the queue gets
	// everything, the others stand by (strict order across a group).
	SingleActiveConsumer bool
	// DelayBuckets are the delays a Nak(delay) is rounded up to (the
	// largest caps it). Default DefaultDelayBuckets (1s .. 5m).
	DelayBuckets []time.Duration
	// ConsumerTimeout is the broker's consumer_timeout (30 min unless the
	// server's configuration changes it): a channel holding a delivery
	// unacked for longer is closed by the broker and its deliveries
	// requeued. Used for RedeliveryWindow only.
	ConsumerTimeout time.Duration
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	c.Conn = c.Conn.withDefaults("idem-subscriber:" + c.Queue)
	if c.Exchange == "" {
		c.Exchange = DefaultExchange
	}
	if c.ExchangeType == "" {
		c.ExchangeType = DefaultExchangeType
	}
	if c.DeliveryLimit == 0 {
		c.DeliveryLimit = DefaultDeliveryLimit
	}
	if c.DeadLetterExchange == "" {
		c.DeadLetterExchange = c.Queue + ".dlx"
	}
	if c.DeadLetterQueue == "" {
		c.DeadLetterQueue = c.Queue + ".dlq"
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if len(c.DelayBuckets) == 0 {
		c.DelayBuckets = DefaultDelayBuckets
	}
	c.DelayBuckets = slices.Sorted(slices.Values(c.DelayBuckets))
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = DefaultConsumerTimeout
	}
	return c
}

// Validate reports a configuration error, wrapping idem.ErrInvalidArgument.
func (c SubscriberConfig) Validate() error {
	errs := c.Conn.validate()
	if c.Queue == "" {
		errs = append(errs, errors.New("no Queue"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("no Topics (routing keys to bind the queue with)"))
	}
	if c.DeliveryLimit < -1 {
		errs = append(errs, errors.New("DeliveryLimit must be -1 (none) or >= 0"))
	}
	if c.Prefetch < 0 || c.Prefetch > math.MaxUint16 {
		errs = append(errs, fmt.Errorf("Prefetch %d not in [0, 65535]", c.Prefetch))
	}
	if c.Term != TermDeadLetter && c.Term != TermAck {
		errs = append(errs, fmt.Errorf("unknown Term policy %d", c.Term))
	}
	for _, d := range c.DelayBuckets {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("DelayBuckets: %s < 1ms", d))
		}
	}
	if c.ConsumerTimeout < 0 {
		errs = append(errs, errors.New("negative ConsumerTimeout"))
	}
	errs = append(errs, checkExchange(c.Exchange, c.ExchangeType)...)
	if c.Queue != "" {
		// The names the subscriber declares; the first refused one is
		// reported (a bad Queue makes every derived name bad).
		d := c.withDefaults()
		check := []error{
			checkName("Queue", d.Queue, false),
			checkName("DeadLetterExchange", d.DeadLetterExchange, true),
			checkName("DeadLetterQueue", d.DeadLetterQueue, false),
		}
		for _, b := range d.DelayBuckets {
			check = append(check, checkName("delay queue", d.DelayQueue(b), false))
		}
		for _, err := range check {
			if err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return invalid(errs)
}

// MaxDeliveries is how many times the broker delivers a message at most
// (DeliveryLimit+1), 0 for no limit (Classic, or DeliveryLimit -1).
func (c SubscriberConfig) MaxDeliveries() int {
	c = c.withDefaults()
	if c.Classic || c.DeliveryLimit < 0 {
		return 0
	}
	return c.DeliveryLimit + 1
}

// RedeliveryWindow is the longest the broker may keep bringing a message
// back: a delivery held unacked by a live consumer is requeued after
// ConsumerTimeout, up to MaxDeliveries times, and a nak'ed message waits up
// to the largest delay bucket. Unbounded without a delivery limit. Nak
// delays chosen by the consumer come on top (each at most the largest
// bucket); see docs/rabbitbroker.md.
func (c SubscriberConfig) RedeliveryWindow() time.Duration {
	c = c.withDefaults()
	n := c.MaxDeliveries()
	if n == 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(n)*c.ConsumerTimeout + c.DelayBuckets[len(c.DelayBuckets)-1]
}

// bucket is the delay queue a Nak(d) goes to: the smallest bucket >= d,
// else the largest.
func (c SubscriberConfig) bucket(d time.Duration) time.Duration {
	for _, b := range c.DelayBuckets {
		if b >= d {
			return b
		}
	}
	return c.DelayBuckets[len(c.DelayBuckets)-1]
}

// DelayQueue is the name of the delay queue for bucket b.
func (c SubscriberConfig) DelayQueue(b time.Duration) string {
	return fmt.Sprintf("%s.delay.%s", c.Queue, b)
}

func invalid(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: rabbitbroker: %w", idem.ErrInvalidArgument, errors.Join(errs...))
}
