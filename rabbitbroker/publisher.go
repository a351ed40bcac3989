package rabbitbroker

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers this package sets on every message it publishes, beside
// broker.HeaderMessageID and the caller's headers.
const (
	// HeaderKey carries Message.Key, base64-encoded (AMQP has no key
	// field; headers are text).
	HeaderKey = "idem-key"
	// headerTopic and headerDeliveries travel on the copies Nak(delay)
	// publishes to a delay queue: the original routing key (the copy comes
	// back through the delay queue's dead-letter routing) and the
	// deliveries so far (the broker's count restarts on the copy).
	headerTopic      = "idem-topic"
	headerDeliveries = "idem-deliveries"
)

// Publisher publishes to one exchange with publisher confirms: persistent
// messages (delivery mode 2), mandatory (a message no queue is bound for
// is returned: ErrUnroutable), AMQP message-id = Message.ID. It keeps its
// own connection and reconnects (declaring the exchange again) after the
// connection drops.
type Publisher struct {
	cfg    PublisherConfig
	k      *keeper[pubGen]
	closed atomic.Bool
}

type pubGen struct {
	cc *confirmCh
}

// NewPublisher returns a Publisher and starts connecting in the
// background: an unreachable broker is not an error here (Publish waits
// for the connection within its context; WaitReady tells).
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Publisher{cfg: cfg}
	p.k = startKeeper(cfg.Conn, "publisher", p.setup)
	return p, nil
}

func (p *Publisher) setup(c *amqp.Connection) (pubGen, *link, error) {
	l := newLink(c)
	ch, err := c.Channel()
	if err != nil {
		return pubGen{}, nil, err
	}
	if err := ch.ExchangeDeclare(p.cfg.Exchange, p.cfg.ExchangeType, true, false, false, false, nil); err != nil {
		return pubGen{}, nil, fmt.Errorf("declare exchange %s: %w", p.cfg.Exchange, err)
	}
	_ = ch.Close()
	cc, err := newConfirmCh(c, l, "publish channel")
	if err != nil {
		return pubGen{}, nil, err
	}
	return pubGen{cc: cc}, l, nil
}

// WaitReady waits until the publisher is connected with its exchange
// declared, or ctx ends (its error, with the last connection error).
func (p *Publisher) WaitReady(ctx context.Context) error {
	_, _, err := p.k.current(ctx)
	return err
}

// Connected reports whether the publisher has a live connection now.
func (p *Publisher) Connected() bool { return p.k.connected() }

// Publish sends msgs to the exchange, routing key Message.Topic, and
// returns once the broker has confirmed every one: nil means each is
// stored (persistent) in every queue its routing key reaches. Without a
// connection it waits for one within ctx (or Timeout). Errors:
// ErrUnroutable (not stored: no queue bound), idem.ErrUnknownOutcome (the
// connection dropped or ctx ended with confirms pending: publish the same
// ids again; consumers dedup by id), a broker nack (not stored). A message
// without a traceparent gets ctx's trace context (broker.InjectTrace).
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	out := make([]outgoing, len(msgs))
	for i, m := range msgs {
		o, err := p.toAMQP(ctx, m)
		if err != nil {
			return err
		}
		out[i] = o
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	g, _, err := p.k.current(ctx)
	if err != nil {
		if p.closed.Load() {
			return broker.ErrClosed
		}
		return fmt.Errorf("%w: rabbitbroker: publish: %w", idem.ErrUnavailable, err)
	}
	return g.cc.publish(ctx, out)
}

func (p *Publisher) toAMQP(ctx context.Context, m *broker.Message) (outgoing, error) {
	if m.ID == "" {
		return outgoing{}, fmt.Errorf("%w: rabbitbroker: message without ID (ids are fixed by the producer): %w", idem.ErrInvalidArgument, broker.ErrRejected)
	}
	m = broker.InjectTrace(ctx, m)
	h := make(amqp.Table, len(m.Headers)+2)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[broker.HeaderMessageID] = m.ID
	if m.Key != nil {
		h[HeaderKey] = base64.StdEncoding.EncodeToString(m.Key)
	}
	return outgoing{exchange: p.cfg.Exchange, key: m.Topic, pub: amqp.Publishing{
		Headers:      h,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    time.Now(),
		Body:         m.Payload,
	}}, nil
}

// Close closes the connection. Publish calls under way end with an error
// (ErrUnknownOutcome for those waiting for confirms).
func (p *Publisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.k.close()
	return nil
}

var _ broker.Publisher = (*Publisher)(nil)
