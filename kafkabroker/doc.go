// Package kafkabroker is idem's Kafka adapter on franz-go: a broker.Publisher
// with acks=all and the idempotent producer (optionally transactional), and a
// broker.Subscriber that consumes as a consumer group with manual commits of
// the contiguous prefix of settled offsets only, redelivers nak'd messages
// after their delay while keeping their offsets uncommitted, and survives
// rebalances without committing past an unsettled message. It joins in the
// background and keeps retrying while the brokers are unreachable; WaitReady
// tells when it has joined (broker.Readier). Partition callbacks given in
// ClientOpts run after its own, and Close is bounded by CloseTimeout even
// while the group is stuck in a rebalance.
//
// The message id travels in the idem-message-id header; a keyless message is
// partitioned by its id so every publish of one id lands in one partition.
// See docs/kafkabroker.md for the design and its trade-offs.
package kafkabroker
