// Package natsbroker is idem's NATS JetStream adapter (github.com/nats-io/nats.go
// jetstream) for the broker-neutral model in package broker.
//
// Publisher waits for a publish ack on every message and sets Nats-Msg-Id to
// the producer-fixed message id, so the stream's duplicate window drops
// producer retries; the id also travels in the idem-message-id header and
// Message.Key in the idem-key header (base64). Message.Topic is the subject.
//
// Subscriber reads one durable pull consumer (the consumer group) with
// explicit acks only: nothing is acked until the caller's handler says so.
// AckWait, MaxDeliver and BackOff are the consumer's; Nak maps to
// NakWithDelay, InProgress to the +WPI heartbeat that resets AckWait, Term
// to TermWithReason on servers from 2.10.4 and to a plain +TERM on older
// ones (which ignore a term carrying a reason; the version is read from the
// connection at each Term). NewSubscriber refuses servers older than
// MinServerVersion (2.9.0). MaxDeliveries reports the consumer's MaxDeliver
// (broker.DeliveryLimiter), so the consumer runtime dead-letters a message
// on its last delivery. RedeliveryWindow reports AckWait*MaxDeliver (or the
// sum of the BackOff steps) so the guard can warn when records expire
// sooner. A server that cannot be reached, or a stream that does not exist
// yet, does not fail NewSubscriber: the durable consumer is created in the
// background with backoff, Fetch waits for it and WaitReady tells
// (broker.Readier). The caller owns the NATS connection (connect with
// nats.RetryOnFailedConnect to start before the server). See
// docs/natsbroker.md.
package natsbroker
