// Package rabbitbroker is idem's RabbitMQ adapter (github.com/rabbitmq/amqp091-go)
// for the broker-neutral model in package broker.
//
// Publisher publishes to one exchange (durable, "idem" by default) with
// Message.Topic as the routing key, persistent (delivery mode 2),
// mandatory (a message no queue is bound for is an error, ErrUnroutable)
// and with publisher confirms: Publish returns once every message is
// confirmed. The AMQP message-id is Message.ID (also in the
// idem-message-id header), Message.Key travels base64 in idem-key, and the
// W3C trace context in traceparent/tracestate.
//
// Subscriber consumes one queue (the consumer group) with manual acks and
// basic.qos prefetch as the in-flight bound. By default the queue is a
// quorum queue with a delivery limit (x-delivery-limit 20, reported by
// MaxDeliveries as broker.DeliveryLimiter) and a dead-letter exchange and
// queue (at-least-once dead-lettering); classic queues are an option.
// Nak(delay) sends a copy to a delay queue per delay bucket (message TTL,
// dead-lettered back to the work queue) and acks the delivery; Nak(0)
// requeues. Term rejects to the dead-letter exchange (or acks:
// TermPolicy). InProgress is a no-op: see docs/rabbitbroker.md for the
// broker's consumer_timeout and what the consumer runtime's holds mean
// there.
//
// Lag (broker.LagReporter) counts the ready and delayed messages of the
// queue and this subscriber's unsettled deliveries.
//
// Publisher and Subscriber each keep their own connection and reconnect
// with backoff after it drops or the broker restarts, declaring their
// topology again; New never fails because the broker is unreachable
// (WaitReady, Connected). Deliveries of a dead connection cannot be
// settled (ErrDeliveryLost); the broker redelivers them.
package rabbitbroker
