package watermillidem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/idem-dev/idem"
)

// ErrPoison marks the error a message failed for good is nacked with when
// no DeadLetter is configured (with the cause: idem.ErrFailed,
// idem.ErrFingerprintMismatch or ErrNoKey).
var ErrPoison = errors.New("watermillidem: message failed for good")

// IsPoison reports an error this middleware returns for a message that
// failed for good: the filter for middleware.PoisonQueueWithFilter.
func IsPoison(err error) bool { return errors.Is(err, ErrPoison) }

// Metadata set on a dead-letter copy besides Watermill's poison queue keys
// (middleware.ReasonForPoisonedKey and the others).
const MetadataOriginalUUID = "idem_original_uuid"

// poison dead-letters msg once (guarded by a key of its own identity) and
// acks it, or nacks it with ErrPoison when there is no dead-letter topic.
func (d *Deduplicator) poison(msg *message.Message, cause error) ([]*message.Message, error) {
	if d.cfg.DeadLetter == nil {
		d.cfg.Logger.Error("watermillidem: message failed for good and no DeadLetter is set; nacked", "uuid", msg.UUID, "err", cause)
		return nil, fmt.Errorf("%w: %w", ErrPoison, cause)
	}
	ctx := msg.Context()
	sum := identity(msg)
	key := []byte("dead-letter:" + hex.EncodeToString(sum))
	held, _, err := d.cfg.Guard.Acquire(ctx, key)
	switch {
	case err == nil && held == nil: // published before (a redelivery)
		return nil, nil
	case err != nil:
		// In progress elsewhere, or the store is down: try again later.
		sleep(ctx, d.cfg.RetryWait)
		return nil, err
	}
	dl := msg.Copy()
	dl.UUID = msg.UUID + "/dead-letter/" + hex.EncodeToString(sum)[:16]
	dl.Metadata.Set(MetadataOriginalUUID, msg.UUID)
	dl.Metadata.Set(middleware.ReasonForPoisonedKey, idem.TruncateCause(cause.Error()))
	dl.Metadata.Set(middleware.PoisonedTopicKey, message.SubscribeTopicFromCtx(ctx))
	dl.Metadata.Set(middleware.PoisonedHandlerKey, message.HandlerNameFromCtx(ctx))
	dl.Metadata.Set(middleware.PoisonedSubscriberKey, message.SubscriberNameFromCtx(ctx))
	// The claim is held while the publish is retried: a failing dead-letter
	// topic spends no attempt of the key.
	wait := 100 * time.Millisecond
	for {
		perr := d.cfg.DeadLetter.Publish(d.cfg.DeadLetterTopic, dl)
		if perr == nil {
			break
		}
		d.cfg.Logger.Error("watermillidem: dead-letter publish failed; retrying", "uuid", msg.UUID, "topic", d.cfg.DeadLetterTopic, "err", perr)
		sleep(ctx, wait)
		wait = min(2*wait, d.cfg.HoldWait)
		if ctx.Err() != nil {
			_ = held.Release(context.WithoutCancel(ctx), perr)
			return nil, perr
		}
	}
	d.deadLettered.Add(1)
	if err := held.Complete(context.WithoutCancel(ctx), nil); err != nil && !errors.Is(err, idem.ErrUnrecorded) {
		// Published; a redelivery may publish it again (same UUID, so a
		// deduplicating reader drops it).
		d.cfg.Logger.Warn("watermillidem: dead letter published but not recorded", "uuid", msg.UUID, "err", err)
	}
	return nil, nil
}

// identity digests what makes a delivery this message: where it came from,
// its UUID and payload.
func identity(msg *message.Message) []byte {
	ctx := msg.Context()
	s := sha256.Sum256(idem.FingerprintOf([]byte(message.HandlerNameFromCtx(ctx)), []byte(message.SubscribeTopicFromCtx(ctx)),
		[]byte(msg.UUID), msg.Payload))
	return s[:]
}
