package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// TxBatchHandler is batch mode for effects that live in the same database
// as the idempotency records (invariant 2): in ONE transaction it claims
// the items' keys, applies the effects of those it acquired and completes
// them (with pgstore: ClaimBatchTx, the effect, CompleteTx), then reports
// one outcome per item, in order. The runtime claims nothing itself; it
// settles each message from its outcome. An error means the transaction
// rolled back and nothing happened; wrap idem.ErrUnavailable in it when the
// database is unreachable, so fetching pauses as for a store outage.
//
// Without guard claims the attempt count is the broker's delivery count
// (Message.Delivery): after MaxAttempts deliveries a failing message is
// dead-lettered.
type TxBatchHandler func(ctx context.Context, items []TxItem) ([]TxOutcome, error)

// TxItem is one message of a TxBatchHandler's batch.
type TxItem struct {
	Msg         *broker.Message
	Key         []byte
	Fingerprint []byte
}

// TxStatus is what happened to one TxItem.
type TxStatus uint8

const (
	// TxDone: the claim, the effect and the completion were committed.
	TxDone TxStatus = iota + 1
	// TxDuplicate: the key was already completed; nothing was done.
	TxDuplicate
	// TxInProgress: another holder has the key; retry after RetryAfter.
	TxInProgress
	// TxRejected: the key failed for good or was reused with another
	// payload; dead-letter it.
	TxRejected
	// TxRetry: not done this time (Err says why); retry with backoff.
	TxRetry
)

// TxOutcome is a TxBatchHandler's report on one item.
type TxOutcome struct {
	Status     TxStatus
	RetryAfter time.Duration // for TxInProgress
	Err        error         // for TxRejected and TxRetry
}

// processTxBatch hands the batch to the TxBatchHandler and settles each
// message from its outcome.
func (c *Consumer) processTxBatch(ctx context.Context, claims []*delivery) {
	items := make([]TxItem, len(claims))
	for i, d := range claims {
		items[i] = TxItem{Msg: d.m, Key: d.key, Fingerprint: d.fp}
	}
	var outs []TxOutcome
	var err error
	for try := 0; ; try++ {
		outs, err = c.runTxHandler(ctx, items, claims)
		if err == nil && len(outs) != len(items) {
			err = fmt.Errorf("consumer: TxBatchHandler returned %d outcomes for %d items", len(outs), len(items))
		}
		if err == nil || !c.retryInProcess(ctx, try, err, nil) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, idem.ErrUnavailable) {
			c.storeDown() // the database is unreachable: pause fetching too
		}
		c.log.Warn("consumer: transactional batch failed as a whole", "messages", len(claims), "err", err)
		for _, d := range claims {
			c.txRetry(ctx, d, err, c.cfg.Batch.OnFailure == BatchDeadLetter)
		}
		return
	}
	settle, cancel := settlingFor(ctx, len(claims))
	defer cancel()
	for i, o := range outs {
		d := claims[i]
		switch o.Status {
		case TxDone:
			c.stats.handled.Add(1)
			c.stats.duplicates.Add(int64(len(d.followers)))
			c.ack(settle, d)
		case TxDuplicate:
			c.stats.duplicates.Add(int64(1 + len(d.followers)))
			c.ack(settle, d)
		case TxInProgress:
			c.nak(settle, d, max(o.RetryAfter, time.Millisecond), "in progress elsewhere")
		case TxRejected:
			reason := "rejected by the transactional handler"
			if o.Err != nil {
				reason = o.Err.Error()
			}
			c.deadLetter(ctx, d, reason)
		default: // TxRetry, or a status the handler should not have used
			cause := o.Err
			if cause == nil {
				cause = fmt.Errorf("consumer: outcome status %d", o.Status)
			}
			c.txRetry(ctx, d, cause, false)
		}
	}
}

// txRetry naks d with backoff by delivery count, or dead-letters it when
// the deliveries are used up or now is set.
func (c *Consumer) txRetry(ctx context.Context, d *delivery, cause error, now bool) {
	if now || d.m.Delivery >= c.cfg.MaxAttempts {
		c.deadLetter(ctx, d, fmt.Sprintf("transactional batch failed after %d deliveries: %v", d.m.Delivery, cause))
		return
	}
	c.nak(ctx, d, c.retryDelay(d.m.Delivery), "transactional batch failed")
}

func (c *Consumer) runTxHandler(ctx context.Context, items []TxItem, ds []*delivery) (outs []TxOutcome, err error) {
	hctx, cancel := context.WithCancelCause(ctx)
	stop := c.keepAlive(hctx, cancel, nil, ds...)
	defer stop()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: transactional batch handler panicked", "messages", len(items), "panic", r, "stack", string(debug.Stack()))
			outs, err = nil, fmt.Errorf("consumer: transactional batch handler panicked: %v", r)
		}
	}()
	return c.cfg.TxBatchHandler(hctx, items)
}
