// Package broker is idem's broker-neutral message model: what every broker
// adapter produces and consumes, so the consumer runtime and the shared
// broker conformance suite (brokertest) work with any of them. The
// adapters are membroker (in memory, in this module), natsbroker (NATS
// JetStream), kafkabroker (Kafka, franz-go), rabbitbroker (RabbitMQ,
// amqp091-go), streamsbroker (Redis Streams, go-redis) and rocketbroker
// (RocketMQ 4.x, rocketmq-client-go), each its own module; the README's
// layout table lists them as they are added.
package broker

import (
	"context"
	"errors"
	"time"
)

// Well-known header names carried on every message idem publishes.
const (
	// HeaderMessageID carries the producer-fixed message id where the
	// broker has no native field for it (JetStream also sets Nats-Msg-Id).
	HeaderMessageID = "idem-message-id"
	// HeaderTraceParent and HeaderTraceState carry W3C trace context.
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// ErrClosed is returned by a closed publisher or subscriber.
var ErrClosed = errors.New("broker: closed")

// ErrDeliveryLost is wrapped by the error of an Acker call (Ack, Nak,
// Term, InProgress) on a delivery that can no longer be settled through
// its subscriber and that the broker will deliver again (to this
// subscriber or another member of its group): the connection or channel
// it came on closed (RabbitMQ), its entry was reclaimed by another
// consumer (Redis Streams), its partition was revoked (Kafka), its
// subscriber was closed (RocketMQ). Nothing the caller does with this
// delivery reaches the broker any more; the redelivered copy is the
// message now. Adapters keep their own sentinels for it, each wrapping
// this one, so errors.Is(err, broker.ErrDeliveryLost) holds for all.
//
// The consumer runtime stops working for a lost delivery: it does not
// retry or hold it, and lets go of its claim if the handler has not run,
// so that the redelivered copy is handled at once (see package consumer).
var ErrDeliveryLost = errors.New("broker: delivery lost; the broker redelivers it")

// Message is one delivery. ID is fixed by the producer before the first send
// (never generated at delivery time), so every redelivery of the same
// message has the same ID.
type Message struct {
	ID          string
	Topic       string
	Key         []byte            // partition / ordering key, may be nil
	Headers     map[string]string // may be nil
	Payload     []byte
	Delivery    int // 1 on the first delivery, as far as the broker counts
	PublishedAt time.Time

	// Acker settles this delivery. Set by the subscriber; nil on messages
	// being published.
	Acker Acker
}

// Acker settles one delivery. After Ack, Nak or Term the delivery is settled
// and further calls return nil without effect.
//
// A call on a delivery that can no longer be settled through this
// subscriber, and that the broker will redeliver, returns an error wrapping
// ErrDeliveryLost (an adapter that cannot tell returns nil, or its other
// error). It is no failure of the effect: after a lost Ack of a recorded
// effect the redelivered copy is answered as a duplicate.
type Acker interface {
	// Ack: the effect is durable; the broker must not redeliver.
	Ack(ctx context.Context) error
	// Nak: not done; redeliver after at least delay (0: soon).
	Nak(ctx context.Context, delay time.Duration) error
	// Term: never redeliver (poison message, already dead-lettered).
	Term(ctx context.Context, reason string) error
	// InProgress tells the broker the handler is still working so it does
	// not redeliver yet. A no-op where the broker has no such notion. The
	// consumer runtime calls it every InProgressInterval for each
	// delivery it has in hand, so it is also how a delivery found lost
	// (ErrDeliveryLost) is noticed before it is settled.
	InProgress(ctx context.Context) error
}

// LostNotifier is an optional Acker capability: Lost returns a channel
// that is closed once the delivery is lost (its Acker calls would return
// ErrDeliveryLost), so that whoever holds it learns so at once rather than
// at its next call. Many deliveries may share one channel (rabbitbroker:
// one per connection, closed when the connection dies, whether or not
// they were settled before); it never closes while the delivery can still
// be settled. Lost must be cheap: the consumer runtime calls it once per
// delivery and watches each distinct channel with one goroutine.
type LostNotifier interface {
	Lost() <-chan struct{}
}

// Publisher sends messages with the broker's reliable settings. Publish
// returns only once the broker has durably accepted every message (acks=all,
// publisher confirms, JetStream publish ack); an error means some may not
// have been.
type Publisher interface {
	Publish(ctx context.Context, msgs ...*Message) error
	Close() error
}

// Subscriber pulls deliveries for one consumer group / durable consumer.
type Subscriber interface {
	// Fetch blocks until at least one message is available or ctx is done,
	// and returns at most max messages. It returns ctx's error when ctx ends
	// first and ErrClosed after Close.
	Fetch(ctx context.Context, max int) ([]*Message, error)
	// RedeliveryWindow is the longest time the broker may take to redeliver
	// an unsettled message (ack wait times max deliveries, retry topics...),
	// so the guard can warn when record retention is shorter.
	RedeliveryWindow() time.Duration
	Close() error
}

// DeliveryLimiter is an optional Subscriber capability: the broker stops
// delivering a message after MaxDeliveries deliveries (0: no limit), and
// does so silently (JetStream's MaxDeliver): a message nak'ed or left
// unsettled on its last delivery is never seen again. The consumer runtime
// therefore never hands a message on its last delivery
// (Message.Delivery >= MaxDeliveries) back to the broker: it keeps it and
// retries in process, and dead-letters it if it must let go (shutdown).
// MaxDeliveries must not change during the subscriber's life.
type DeliveryLimiter interface{ MaxDeliveries() int }
