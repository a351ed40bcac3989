// Package streamsbroker is idem's Redis Streams adapter (go-redis v9) for
// the broker-neutral model in package broker, on a single node, Sentinel
// or a Redis Cluster (Redis 7.0 or later).
//
// Publisher adds each message with XADD in one Lua script that also keeps
// its id for a dedup window (a re-publish of the same id within it adds
// nothing) and can refuse a full stream (MaxLen) instead of trimming it.
// The script is never re-sent by go-redis behind the caller's back: a lost
// reply is idem.ErrUnknownOutcome. The message id, key, payload and each
// header are fields of the entry; Message.Topic is the stream key.
//
// Subscriber is one consumer of a consumer group. Fetch reclaims entries
// idle past AckWait (XAUTOCLAIM, with each entry's delivery count read
// from XPENDING in the same script) every ClaimInterval and otherwise
// reads new ones (XREADGROUP >, blocking at most PollWait; the next read
// is sent ahead while the caller works). Ack is XACK (queued and sent in batches
// by a flusher, or inline with AckSync); Nak(delay) leaves the entry
// pending with its idle time set so a reclaim redelivers it after delay
// (at most AckWait); InProgress resets the idle time (XCLAIM JUSTID); Term
// is XACK (plus a copy to the dead-letter stream with DeadLetterOnTerm).
// MaxDeliver bounds deliveries: an entry whose last delivery is left
// unsettled is moved to DeadLetterStream and acked in one script, never
// dropped, and MaxDeliveries reports the limit (broker.DeliveryLimiter) so
// the consumer runtime dead-letters a last delivery itself. Fetch also
// trims what every group is done with (never an entry a group has pending
// or has not read). Close hands the consumer's unsettled entries back to
// the group at once. Lag (broker.LagReporter) counts the group's pending
// and unread entries. RedeliveryWindow is MaxDeliver x (AckWait +
// ClaimInterval). Every script's keys share the stream's cluster slot.
// See docs/streamsbroker.md.
package streamsbroker
