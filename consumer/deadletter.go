package consumer

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"maps"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// Headers added to dead-lettered messages.
const (
	HeaderDeadLetterReason = "idem-dead-letter-reason"
	HeaderOriginalTopic    = "idem-original-topic"
	HeaderOriginalID       = "idem-original-id"
	HeaderDelivery         = "idem-delivery"
)

// deadLetter publishes d to the dead-letter topic, once per distinct
// message, then terminates it. The publish is guarded by a key derived
// from the message's identity (topic, id and payload), not from its
// idempotency key: a later, different message with the same idempotency
// key (reused after a poison message, or a fingerprint mismatch) is
// dead-lettered too, while a redelivery of one already published is only
// terminated. The dead-letter message's id is derived from the same
// identity, so a broker that deduplicates by id (JetStream's Nats-Msg-Id)
// drops a republish after a crash between the publish and its record.
//
// A failed publish holds the message (and its order key) and retries it;
// it is counted and logged but does not pause the consumer.
func (c *Consumer) deadLetter(ctx context.Context, d *delivery, reason string) []*hold {
	var hs []*hold
	if len(d.followers) > 0 {
		// Followers share d's key; those that are other messages (another
		// id or payload under a business key) are dead-lettered on their own.
		same := d.followers[:0:0]
		for _, f := range d.followers {
			if f.m.ID == d.m.ID && f.m.Topic == d.m.Topic && bytes.Equal(f.m.Payload, d.m.Payload) {
				same = append(same, f)
			} else {
				hs = append(hs, c.deadLetter(ctx, f, reason)...)
			}
		}
		d.followers = same
	}
	return append(hs, c.deadLetterOne(ctx, d, reason)...)
}

func (c *Consumer) deadLetterOne(ctx context.Context, d *delivery, reason string) []*hold {
	if d.isLost() { // its redelivered copy comes to the same decision
		return c.letGo(ctx, d)
	}
	m := d.m
	if c.cfg.DeadLetter == nil {
		c.stats.deadLettered.Add(1)
		c.log.Error("consumer: poison message terminated (no dead-letter publisher configured)", "msg_id", m.ID, "topic", m.Topic, "reason", reason)
		c.noteDeadLetter(ctx, d, reason, "", nil)
		c.term(ctx, d, reason)
		return nil
	}
	held, _, err := c.cfg.Guard.Acquire(ctx, deadLetterKey(m))
	var inProg *idem.InProgressError
	switch {
	case err == nil && held == nil:
		// This very message was dead-lettered by an earlier delivery.
		c.storeAnswered()
		c.stats.duplicates.Add(int64(len(d.self())))
		c.log.Info("consumer: message already dead-lettered; terminating", "msg_id", m.ID, "topic", m.Topic)
		c.term(ctx, d, reason)
		return nil
	case err == nil:
		c.storeAnswered()
		return c.publishDeadLetter(ctx, d, reason, held)
	case errors.As(err, &inProg):
		// Another delivery of this message is being dead-lettered now.
		c.storeAnswered()
		return c.nakOrHoldWith(ctx, d, inProg.RetryAfter(time.Now()), "dead-letter in progress elsewhere",
			func(ctx context.Context) []*hold { return c.deadLetterOne(ctx, d, reason) },
			func(ctx context.Context) { c.deadLetterFallback(ctx, d, reason) })
	case errors.Is(err, idem.ErrFailed):
		// The guard marked the dead-letter key failed (its WithMaxAttempts
		// after shutdowns during failing publishes): publish without it;
		// the fixed id still lets a deduplicating broker drop a repeat.
		c.storeAnswered()
		return c.publishDeadLetter(ctx, d, reason, nil)
	default:
		c.storeDown()
		return []*hold{{
			ds: []*delivery{d}, reason: HoldStoreUnavailable, err: err,
			retry:  func(ctx context.Context) []*hold { return c.deadLetterOne(ctx, d, reason) },
			giveUp: func(ctx context.Context) { c.deadLetterFallback(ctx, d, reason) },
		}}
	}
}

// publishDeadLetter publishes under held (the dead-letter key's claim; nil
// when unguarded), records it and terminates d; a failed publish keeps the
// claim and holds d.
func (c *Consumer) publishDeadLetter(ctx context.Context, d *delivery, reason string, held *idem.Held) []*hold {
	if held != nil {
		// The claim may have lapsed since it was taken (this process
		// stalled, its heartbeats failed) and another delivery may have
		// taken the dead-letter key over and published: a broker without
		// dedup by id (Kafka, RabbitMQ) would keep both. A stale holder
		// learns it here, not at its fenced Complete after publishing.
		if err := c.renew(ctx, held); err != nil {
			if lost(held) {
				return c.deadLetterOne(ctx, d, reason)
			}
			return c.deadLetterHold(d, reason, held, HoldStoreUnavailable, err)
		}
	}
	dl := c.deadLetterMessage(d.m, reason)
	pctx, cancel := settling(ctx)
	err := c.cfg.DeadLetter.Publish(pctx, dl)
	cancel()
	if err != nil {
		c.stats.deadLetterErrors.Add(1)
		c.noteDeadLetter(ctx, d, reason, dl.Topic, err)
		c.log.Error("consumer: dead-letter publish failed; holding the message and retrying", "msg_id", d.m.ID, "dead_letter_topic", dl.Topic, "err", err)
		return c.deadLetterHold(d, reason, held, HoldDeadLetter, err)
	}
	if held != nil {
		if cerr := held.Complete(ctx, nil); cerr != nil {
			c.log.Warn("consumer: dead letter published but not recorded; a redelivery may publish it again (same id)", "msg_id", d.m.ID, "err", cerr)
		}
	}
	c.stats.deadLettered.Add(1)
	c.noteDeadLetter(ctx, d, reason, dl.Topic, nil)
	c.log.Warn("consumer: message dead-lettered", "msg_id", d.m.ID, "topic", d.m.Topic, "dead_letter_topic", dl.Topic, "reason", reason)
	c.term(ctx, d, reason)
	return nil
}

// deadLetterHold holds d while its dead-lettering cannot go on (the
// publish failed, or the store did not answer the claim's renewal): the
// retry publishes again under held, whose renewal sends a claim found lost
// back to deadLetterOne; at shutdown the claim is let go and
// deadLetterFallback decides.
func (c *Consumer) deadLetterHold(d *delivery, reason string, held *idem.Held, why HoldReason, err error) []*hold {
	return []*hold{{
		ds: []*delivery{d}, reason: why, err: err,
		retry: func(ctx context.Context) []*hold {
			if d.isLost() {
				if held != nil {
					_ = held.Release(ctx, err)
				}
				return c.letGo(ctx, d)
			}
			return c.publishDeadLetter(ctx, d, reason, held)
		},
		giveUp: func(ctx context.Context) {
			if held != nil {
				_ = held.Release(ctx, err)
			}
			c.deadLetterFallback(ctx, d, reason)
		},
	}}
}

// deadLetterAtShutdown dead-letters d, which the consumer must let go of
// while it is on its last broker delivery; whatever holds it is given up
// (see deadLetterFallback).
func (c *Consumer) deadLetterAtShutdown(ctx context.Context, d *delivery, reason string) {
	for _, h := range c.deadLetter(ctx, d, reason) {
		h.giveUp(ctx)
	}
}

// deadLetterFallback lets go of a message whose dead-lettering did not go
// through by shutdown: a nak (its redelivery dead-letters it), or, on its
// last delivery, one publish without the guard's record (the fixed id
// lets a deduplicating broker drop a repeat) and a nak only if that fails
// too, which is then the message's end: logged at error level.
func (c *Consumer) deadLetterFallback(ctx context.Context, d *delivery, reason string) {
	if d.isLost() {
		c.handBack(ctx, d, "lost") // let go: the broker has it
		return
	}
	if !c.lastDelivery(d) {
		c.nak(ctx, d, 0, "dead-letter not done at shutdown")
		return
	}
	if c.cfg.DeadLetter != nil {
		dl := c.deadLetterMessage(d.m, reason)
		if err := c.cfg.DeadLetter.Publish(ctx, dl); err != nil {
			c.stats.deadLetterErrors.Add(1)
			c.noteDeadLetter(ctx, d, reason, dl.Topic, err)
		} else {
			c.stats.deadLettered.Add(1)
			c.noteDeadLetter(ctx, d, reason, dl.Topic, nil)
			c.log.Warn("consumer: message dead-lettered at shutdown", "msg_id", d.m.ID, "dead_letter_topic", dl.Topic, "reason", reason)
			c.term(ctx, d, reason)
			return
		}
	}
	c.log.Error("consumer: message on its last broker delivery could not be dead-lettered at shutdown; the broker will not deliver it again",
		"msg_id", d.m.ID, "topic", d.m.Topic, "reason", reason)
	c.nak(ctx, d, 0, "dead-letter failed at shutdown")
}

// nakOrHoldWith is nakOrHold with its own retry and give-up.
func (c *Consumer) nakOrHoldWith(ctx context.Context, d *delivery, delay time.Duration, why string,
	retry func(context.Context) []*hold, giveUp func(context.Context)) []*hold {
	if d.isLost() {
		return c.letGo(ctx, d)
	}
	if !c.lastDelivery(d) {
		c.nak(ctx, d, delay, why)
		return nil
	}
	return []*hold{{ds: []*delivery{d}, reason: HoldDeliveryLimit, err: holdCause(why), wait: delay, retry: retry, giveUp: giveUp}}
}

func (c *Consumer) noteDeadLetter(ctx context.Context, d *delivery, reason, topic string, err error) {
	if c.cfg.Hooks.OnDeadLetter != nil {
		c.cfg.Hooks.OnDeadLetter(ctx, DeadLetterEvent{Msg: d.m, Reason: reason, Topic: topic, Err: err})
	}
}

func (c *Consumer) deadLetterMessage(m *broker.Message, reason string) *broker.Message {
	dl := &broker.Message{
		ID:      deadLetterID(m),
		Topic:   c.cfg.DeadLetterTopic(m),
		Key:     m.Key,
		Headers: maps.Clone(m.Headers),
		Payload: m.Payload,
	}
	if dl.Headers == nil {
		dl.Headers = map[string]string{}
	}
	dl.Headers[HeaderDeadLetterReason] = idem.TruncateCause(reason)
	dl.Headers[HeaderOriginalTopic] = m.Topic
	dl.Headers[HeaderOriginalID] = m.ID
	dl.Headers[HeaderDelivery] = strconv.Itoa(m.Delivery)
	return dl
}

// messageIdentity tells distinct messages apart: topic, producer-fixed id
// and payload (a business key alone does not).
func messageIdentity(m *broker.Message) []byte {
	return idem.FingerprintOf([]byte(m.Topic), []byte(m.ID), m.Payload)
}

// deadLetterKey is the guard key of m's dead-letter publish.
func deadLetterKey(m *broker.Message) []byte {
	return []byte("dead-letter:" + hex.EncodeToString(messageIdentity(m)))
}

// deadLetterID is the id of m's dead-letter message: its own id plus a
// digest of its identity, so two messages never share one.
func deadLetterID(m *broker.Message) string {
	sum := hex.EncodeToString(messageIdentity(m))
	if m.ID != "" {
		return m.ID + "/dead-letter/" + sum[:16]
	}
	return "dead-letter-" + sum[:32]
}

// derivedKey is key+"/"+suffix, or a hash of it when that is too long.
func derivedKey(key []byte, suffix string) []byte {
	k := make([]byte, 0, len(key)+1+len(suffix))
	k = append(append(append(k, key...), '/'), suffix...)
	if len(k) <= idem.MaxKeyLen {
		return k
	}
	return []byte("sha256:" + hex.EncodeToString(idem.FingerprintOf(k)))
}
