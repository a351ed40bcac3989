// Package rocketbroker is idem's RocketMQ 4.x adapter, on the official Go
// client (github.com/apache/rocketmq-client-go/v2), for the broker-neutral
// model in package broker.
//
// It has NOT been run against a real RocketMQ broker: its tests run the
// official client against an in-process fake of the 4.x remoting protocol
// (internal/fakerocket). docs/rocketbroker.md gives the command that runs
// the same tests against a real name server.
//
// Publisher sends each message synchronously (SendSync; nil only on
// SEND_OK), retried by the client on transport errors (Retries, default 2,
// seed 000). Message.ID travels as the user property idem-message-id and
// as the message's KEYS; RocketMQ has no server-side dedup, so a retried
// send may store a duplicate, which the consumer's guard (keyed on the id)
// answers as one. Message.Key is the SHARDING_KEY (the queue is chosen by
// its hash: per-key order) and, base64, the property idem-key; headers are
// user properties, with the W3C trace context.
//
// Subscriber is a push consumer in clustering mode bridged to Fetch: the
// consume callback hands its message over a bounded channel and blocks
// until the message is settled, so the status it returns reflects the
// effect (ConsumeSuccess after Ack; ConsumeRetryLater with the nak's delay
// level after Nak). Message.Delivery is the reconsume times + 1; a nak on
// the MaxDeliveries-th delivery (MaxReconsumeTimes+1) would send the
// message to %DLQ%<group>, which the consumer runtime avoids
// (broker.DeliveryLimiter): it dead-letters such a message itself, and the
// broker's DLQ is the fallback. Orderly consumption is an option
// (ConsumeOrderly; a nak is SuspendCurrentQueueAMoment). InProgress
// restarts the client's consume timeout. Lag (broker.LagReporter) sums max
// minus committed offsets over the group's queues.
package rocketbroker
