package rabbitbroker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Subscriber consumes one queue with manual acks, prefetch as the
// in-flight bound, on its own connection. It declares its topology (the
// exchange, the queue and its bindings, the dead-letter exchange and
// queue; delay queues when first used) on every connection, and
// reconnects with backoff after the connection drops or the broker
// restarts; an unreachable broker at start is not an error (WaitReady).
// Deliveries of a dead connection cannot be settled any more (their
// Acker returns ErrDeliveryLost): the broker requeues them and delivers
// them again.
type Subscriber struct {
	cfg    SubscriberConfig
	k      *keeper[subGen]
	closed atomic.Bool
}

type subGen struct {
	l          *link
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	delay      *confirmCh

	declMu   sync.Mutex
	declared map[time.Duration]bool

	unsettled atomic.Int64 // deliveries handed out and not settled (Lag)
}

// NewSubscriber checks cfg and starts connecting in the background.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Subscriber{cfg: cfg}
	s.k = startKeeper(cfg.Conn, "subscriber "+cfg.Queue, s.setup)
	return s, nil
}

// queueArgs are the work queue's arguments.
func (c SubscriberConfig) queueArgs() amqp.Table {
	args := amqp.Table{"x-queue-type": "quorum"}
	if c.Classic {
		args["x-queue-type"] = "classic"
	} else if c.DeliveryLimit >= 0 {
		args["x-delivery-limit"] = c.DeliveryLimit
	}
	if !c.NoDeadLetter {
		args["x-dead-letter-exchange"] = c.DeadLetterExchange
		if !c.Classic {
			// Quorum queues dead-letter at most once unless told
			// otherwise: at-least-once keeps a message in the queue
			// until the dead-letter queue has confirmed it.
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
	}
	if c.SingleActiveConsumer {
		args["x-single-active-consumer"] = true
	}
	return args
}

// delayArgs are delay queue b's arguments: messages expire after b and
// are dead-lettered through the default exchange to the work queue.
func (c SubscriberConfig) delayArgs(b time.Duration) amqp.Table {
	args := amqp.Table{
		"x-queue-type":              "quorum",
		"x-message-ttl":             b.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": c.Queue,
	}
	if c.Classic {
		args["x-queue-type"] = "classic"
	} else {
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	return args
}

func (c SubscriberConfig) queueType() string {
	if c.Classic {
		return "classic"
	}
	return "quorum"
}

func (s *Subscriber) setup(c *amqp.Connection) (subGen, *link, error) {
	cfg := s.cfg
	l := newLink(c)
	ch, err := c.Channel()
	if err != nil {
		return subGen{}, nil, err
	}
	if err := declare(ch, cfg); err != nil {
		return subGen{}, nil, err
	}
	if err := ch.Qos(cfg.Prefetch, 0, false); err != nil {
		return subGen{}, nil, fmt.Errorf("qos: %w", err)
	}
	dcc, err := newConfirmCh(c, l, "delay channel")
	if err != nil {
		return subGen{}, nil, err
	}
	l.watch(ch, "consume channel")
	ds, err := ch.Consume(cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return subGen{}, nil, fmt.Errorf("consume %s: %w", cfg.Queue, err)
	}
	// amqp091 hands deliveries over one at a time through an unbuffered
	// channel, so a non-blocking read after the first mostly finds
	// nothing: move them into a buffer as large as the prefetch (the
	// broker sends no more unacked ones than that), so that Fetch
	// returns what has arrived in one call. The goroutine ends when the
	// connection closes (or dies: its deliveries are requeued).
	size := cfg.Prefetch
	if size == 0 {
		size = 4096
	}
	buf := make(chan amqp.Delivery, size)
	go func() {
		defer close(buf)
		for d := range ds {
			select {
			case buf <- d:
			case <-l.dead: // requeued by the broker; nobody may take it now
				return
			}
		}
	}()
	return subGen{l: l, ch: ch, deliveries: buf, delay: dcc, declared: map[time.Duration]bool{}}, l, nil
}

// Lag implements broker.LagReporter, approximately: the messages ready in
// the work queue and waiting in its delay queues (nak'ed with a delay),
// plus this subscriber's deliveries not settled yet. Other members' unacked
// deliveries are not visible over AMQP (the management API has them), and
// messages over the delivery limit are in the dead-letter queue, not
// counted. One passive queue.declare per queue on a channel of its own.
func (s *Subscriber) Lag(ctx context.Context) (int64, error) {
	g, l, err := s.k.current(ctx)
	if err != nil {
		return 0, err
	}
	ch, err := l.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("rabbitbroker: lag: %w", err)
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(s.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("rabbitbroker: lag of %s: %w", s.cfg.Queue, err)
	}
	lag := int64(q.Messages) + g.unsettled.Load()
	for _, b := range s.cfg.DelayBuckets {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		dq, err := ch.QueueDeclarePassive(s.cfg.DelayQueue(b), true, false, false, false, nil)
		if err != nil {
			// Not declared (yet): a 404 closes the channel; go on
			// with a new one.
			_ = ch.Close()
			if ch, err = l.conn.Channel(); err != nil {
				return 0, fmt.Errorf("rabbitbroker: lag: %w", err)
			}
			continue
		}
		lag += int64(dq.Messages)
	}
	return lag, nil
}

// declare declares cfg's exchange, dead-letter exchange and queue, and
// work queue with its bindings. Declarations are idempotent; a queue that
// exists with other arguments is an error (PRECONDITION_FAILED).
func declare(ch *amqp.Channel, cfg SubscriberConfig) error {
	if err := ch.ExchangeDeclare(cfg.Exchange, cfg.ExchangeType, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", cfg.Exchange, err)
	}
	if !cfg.NoDeadLetter {
		if err := ch.ExchangeDeclare(cfg.DeadLetterExchange, "fanout", true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare dead-letter exchange %s: %w", cfg.DeadLetterExchange, err)
		}
		if _, err := ch.QueueDeclare(cfg.DeadLetterQueue, true, false, false, false, amqp.Table{"x-queue-type": cfg.queueType()}); err != nil {
			return fmt.Errorf("declare dead-letter queue %s: %w", cfg.DeadLetterQueue, err)
		}
		if err := ch.QueueBind(cfg.DeadLetterQueue, "", cfg.DeadLetterExchange, false, nil); err != nil {
			return fmt.Errorf("bind dead-letter queue: %w", err)
		}
	}
	if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, cfg.queueArgs()); err != nil {
		return fmt.Errorf("declare queue %s: %w", cfg.Queue, err)
	}
	for _, t := range cfg.Topics {
		if err := ch.QueueBind(cfg.Queue, t, cfg.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to %s with %q: %w", cfg.Queue, cfg.Exchange, t, err)
		}
	}
	return nil
}

// Declare declares the topology a Subscriber with cfg uses (exchange,
// work queue and bindings, dead-letter exchange and queue) over a
// connection of its own, and closes it. RabbitMQ stores a message only in
// the queues bound when it is published: declare a consumer group's queue
// before its publishers start (a Subscriber declares it too, when it
// connects).
func Declare(ctx context.Context, cfg SubscriberConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	ac := cfg.AMQP
	ac.Heartbeat = cfg.Heartbeat
	if dl, ok := ctx.Deadline(); ok {
		ac.Dial = amqp.DefaultDial(min(cfg.DialTimeout, time.Until(dl)))
	} else {
		ac.Dial = amqp.DefaultDial(cfg.DialTimeout)
	}
	c, err := amqp.DialConfig(cfg.URL, ac)
	if err != nil {
		return fmt.Errorf("%w: rabbitbroker: dial: %w", idem.ErrUnavailable, err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return fmt.Errorf("rabbitbroker: %w", err)
	}
	if err := declare(ch, cfg); err != nil {
		return fmt.Errorf("rabbitbroker: %w", err)
	}
	return nil
}

// WaitReady waits until the subscriber is connected, its topology
// declared and its consumer started, or ctx ends (its error, with the
// last connection error).
func (s *Subscriber) WaitReady(ctx context.Context) error {
	_, _, err := s.k.current(ctx)
	return err
}

// Connected reports whether the subscriber has a live connection now.
func (s *Subscriber) Connected() bool { return s.k.connected() }

// Connects is how many times the subscriber has connected (1 until the
// first reconnection).
func (s *Subscriber) Connects() int { return int(s.k.connects.Load()) }

// RedeliveryWindow implements broker.Subscriber (see
// SubscriberConfig.RedeliveryWindow).
func (s *Subscriber) RedeliveryWindow() time.Duration { return s.cfg.RedeliveryWindow() }

// MaxDeliveries implements broker.DeliveryLimiter: the quorum queue
// delivers a message at most DeliveryLimit+1 times, then dead-letters it.
// 0 (no limit) for classic queues or DeliveryLimit -1.
func (s *Subscriber) MaxDeliveries() int { return s.cfg.MaxDeliveries() }

// Fetch waits for the first delivery (and for a connection), then returns
// what else is already buffered, up to max.
func (s *Subscriber) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if max <= 0 {
		max = 1
	}
	for {
		if s.closed.Load() {
			return nil, broker.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		g, _, err := s.k.current(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		var out []*broker.Message
		select {
		case d, ok := <-g.deliveries:
			if !ok {
				g.l.kill(errors.New("consumer cancelled or channel closed"))
				continue
			}
			out = append(out, s.convert(g, d))
		more:
			for len(out) < max {
				select {
				case d, ok := <-g.deliveries:
					if !ok {
						g.l.kill(errors.New("consumer cancelled or channel closed"))
						break more
					}
					out = append(out, s.convert(g, d))
				default:
					break more
				}
			}
		case <-g.l.dead:
			continue
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.k.closeCtx.Done():
			return nil, broker.ErrClosed
		}
		// Deliveries buffered from a connection that died are not
		// handed out: they can never be settled and the broker has
		// requeued them.
		if g.l.isDead() {
			continue
		}
		return out, nil
	}
}

// brokerHeader: headers the broker sets on dead-lettered or quorum
// messages, not part of the published message.
func brokerHeader(k string) bool {
	return k == "x-delivery-count" || k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

func (s *Subscriber) convert(g *subGen, d amqp.Delivery) *broker.Message {
	m := &broker.Message{
		ID:          d.MessageId,
		Topic:       d.RoutingKey,
		Payload:     d.Body,
		PublishedAt: d.Timestamp,
	}
	prior, copied := 0, false
	if len(d.Headers) > 0 {
		m.Headers = make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			switch {
			case k == HeaderKey:
				if s, ok := v.(string); ok {
					if key, err := base64.StdEncoding.DecodeString(s); err == nil {
						m.Key = key
					}
				}
				continue
			case k == headerTopic:
				if t, ok := v.(string); ok {
					m.Topic = t
				}
				continue
			case k == headerDeliveries:
				prior, copied = toInt(v), true
				continue
			case brokerHeader(k):
				continue
			}
			if s, ok := headerString(v); ok {
				m.Headers[k] = s
			}
		}
	}
	if m.ID == "" {
		m.ID = m.Headers[broker.HeaderMessageID]
	}
	if !copied {
		prior = rejectedDeaths(d.Headers)
	}
	// This copy's deliveries: the quorum queue counts returns in
	// x-delivery-count (absent on the first delivery); a classic queue
	// only says whether it was delivered before.
	this := 1
	if n, ok := d.Headers["x-delivery-count"]; ok {
		this = toInt(n) + 1
	} else if d.Redelivered {
		this = 2
	}
	m.Delivery = prior + this
	m.Acker = &acker{s: s, g: g, d: d, topic: m.Topic, delivery: m.Delivery}
	g.unsettled.Add(1)
	return m
}

// rejectedDeaths counts the times a message was rejected (or dropped at a
// delivery limit) by a consumer of some queue before it came here, from
// x-death: each was a delivery. Messages that went round a dead-letter
// retry loop outside this package carry it.
func rejectedDeaths(h amqp.Table) int {
	deaths, _ := h["x-death"].([]any)
	n := 0
	for _, x := range deaths {
		t, ok := x.(amqp.Table)
		if !ok {
			continue
		}
		if r, _ := t["reason"].(string); r == "rejected" || r == "delivery_limit" {
			n += toInt(t["count"])
		}
	}
	return n
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int8:
		return int(n)
	case int16:
		return int(n)
	case int32:
		return int(n)
	case int64:
		return int(min(n, math.MaxInt32))
	case uint8:
		return int(n)
	case uint16:
		return int(n)
	case uint32:
		return int(min(n, math.MaxInt32))
	case uint64:
		return int(min(n, math.MaxInt32))
	case float32:
		return int(n)
	case float64:
		return int(n)
	case string:
		i, _ := strconv.Atoi(n)
		return i
	}
	return 0
}

// headerString renders a header value as text: strings and byte strings
// as they are, numbers, booleans and times in their usual form; tables
// and arrays are left out.
func headerString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case bool, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64:
		return fmt.Sprint(x), true
	case time.Time:
		return x.UTC().Format(time.RFC3339), true
	}
	return "", false
}

// Close cancels the consumer and closes the connection: the broker
// requeues every delivery not yet acked.
func (s *Subscriber) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.k.close()
	return nil
}

type acker struct {
	s        *Subscriber
	g        *subGen
	d        amqp.Delivery
	topic    string
	delivery int
	settled  atomic.Bool
}

func (a *acker) settle(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !a.settled.CompareAndSwap(false, true) {
		return nil
	}
	if a.g.l.isDead() {
		a.settled.Store(false)
		return ErrDeliveryLost
	}
	if err := f(); err != nil {
		a.settled.Store(false)
		switch {
		case errors.Is(err, ErrDeliveryLost):
			return err
		case a.g.l.isDead() || errors.Is(err, amqp.ErrClosed):
			return fmt.Errorf("%w: %w", ErrDeliveryLost, err)
		}
		return fmt.Errorf("rabbitbroker: %w", err)
	}
	a.g.unsettled.Add(-1)
	return nil
}

// Ack implements broker.Acker: basic.ack.
func (a *acker) Ack(ctx context.Context) error {
	return a.settle(ctx, func() error { return a.g.ch.Ack(a.d.DeliveryTag, false) })
}

// Nak implements broker.Acker. Without a delay: basic.nack with requeue
// (redelivered at once, counted by the quorum queue). With one: a copy
// goes to the delay queue of the smallest bucket >= delay (its messages
// expire after the bucket and are dead-lettered back to the work queue),
// confirmed by the broker, and then the delivery is acked; if the copy
// cannot be stored, the delivery is requeued at once instead (early
// rather than lost or stuck unacked). If the delivery's connection dies
// meanwhile (or ctx ends and the copy's publish gives the connection up),
// Nak returns ErrDeliveryLost at once: the broker requeues the delivery
// (and the copy, if it was stored after all, is delivered too: a
// duplicate, never a loss).
func (a *acker) Nak(ctx context.Context, delay time.Duration) error {
	return a.settle(ctx, func() error {
		if delay <= 0 {
			return a.g.ch.Nack(a.d.DeliveryTag, false, true)
		}
		if err := a.delayCopy(ctx, delay); err != nil {
			if a.g.l.isDead() {
				// A nack now could only be written to a
				// connection being closed. The copy's outcome is
				// only a detail (%v): what the caller acts on is
				// the loss.
				return fmt.Errorf("%w (delayed copy: %v)", ErrDeliveryLost, err)
			}
			a.s.cfg.Logger.Warn("rabbitbroker: delayed nak failed; requeued at once", "msg_id", a.d.MessageId, "delay", delay, "err", err)
			return a.g.ch.Nack(a.d.DeliveryTag, false, true)
		}
		return a.g.ch.Ack(a.d.DeliveryTag, false)
	})
}

func (a *acker) delayCopy(ctx context.Context, delay time.Duration) error {
	cfg := a.s.cfg
	b := cfg.bucket(delay)
	q := cfg.DelayQueue(b)
	if err := a.g.declareDelay(cfg, b); err != nil {
		return err
	}
	h := make(amqp.Table, len(a.d.Headers)+2)
	for k, v := range a.d.Headers {
		if !brokerHeader(k) {
			h[k] = v
		}
	}
	h[headerTopic] = a.topic
	h[headerDeliveries] = int64(a.delivery)
	d := a.d
	pub := amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type,
		AppId: d.AppId, Body: d.Body,
		// No Expiration (it would drop the copy) and no UserId (the
		// broker checks it against this connection's user).
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return a.g.delay.publish(ctx, []outgoing{{exchange: "", key: q, pub: pub}})
}

// declareDelay declares delay queue b once per connection.
func (g *subGen) declareDelay(cfg SubscriberConfig, b time.Duration) error {
	g.declMu.Lock()
	defer g.declMu.Unlock()
	if g.declared[b] {
		return nil
	}
	if _, err := g.delay.ch.QueueDeclare(cfg.DelayQueue(b), true, false, false, false, cfg.delayArgs(b)); err != nil {
		return fmt.Errorf("declare delay queue %s: %w", cfg.DelayQueue(b), err)
	}
	g.declared[b] = true
	return nil
}

// Term implements broker.Acker per SubscriberConfig.Term: reject without
// requeue (to the dead-letter exchange) or ack.
func (a *acker) Term(ctx context.Context, reason string) error {
	return a.settle(ctx, func() error {
		if a.s.cfg.Term == TermAck {
			return a.g.ch.Ack(a.d.DeliveryTag, false)
		}
		return a.g.ch.Reject(a.d.DeliveryTag, false)
	})
}

// InProgress implements broker.Acker. AMQP has no per-delivery deadline:
// a delivery stays with its channel until settled (or until the broker's
// consumer_timeout closes the channel), so this only reports a delivery
// whose connection died (ErrDeliveryLost: the broker redelivers it).
func (a *acker) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if a.settled.Load() {
		return nil
	}
	if a.g.l.isDead() {
		return ErrDeliveryLost
	}
	return nil
}

// Lost implements broker.LostNotifier: the delivery's connection's
// channel, closed when the connection (or a channel of it) dies.
func (a *acker) Lost() <-chan struct{} { return a.g.l.dead }

var (
	_ broker.LostNotifier    = (*acker)(nil)
	_ broker.Subscriber      = (*Subscriber)(nil)
	_ broker.DeliveryLimiter = (*Subscriber)(nil)
	_ broker.LagReporter     = (*Subscriber)(nil)
	_ broker.Readier         = (*Subscriber)(nil)
)
