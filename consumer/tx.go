package consumer

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/idem-dev/idem/broker"
)

// TxBatchHandler is batch mode for effects that live in the same database
// as the idempotency records (invariant 2): in ONE transaction it claims
// the items' keys, applies the effects of those it acquired and completes
// them (with pgstore: ClaimBatchTx, the effect, CompleteBatchTx), then
// reports one outcome per item, in order. The runtime claims nothing
// itself; it settles each message from its outcome. An error means the
// transaction rolled back and nothing happened.
//
// The runtime classifies the error (and each TxRetry outcome's Err) as it
// does a Handler's (idem.ClassifyError, the guard's store's
// idem.ErrorClassifier, Config.ClassifyError): when the database could not
// be reached or the outcome is unknown, the messages are held and the
// transaction is run again when it answers, spending no attempt; return
// the driver's error as it is.
//
// What holds a key: the claim is written by the handler's transaction, so
// until it commits the key is held by the transaction's row locks (a
// concurrent claim of the key, in or out of a transaction, waits on the
// row), whatever the claim's lease says; there is no guard claim for the
// runtime to heartbeat, so no lease can be lost while the handler runs
// and its context is not cancelled for one, and MessageToken reports
// false: the fencing token is the handler's own (Claim.Record.Token). The
// handler must therefore claim inside its transaction (a claim made
// outside it would be heartbeated by nobody), keep the transaction open
// no longer than it must (concurrent duplicates wait on it), and return
// when ctx ends (shutdown past ShutdownTimeout). The broker's ack wait is
// kept by the runtime's InProgress signal.
//
// Without guard claims the attempt count is the broker's delivery count
// (Message.Delivery) plus this process's in-process retries of a held
// delivery: after MaxAttempts a failing message is dead-lettered.
// Deliveries held for unavailability are not nak'ed and so not counted;
// only one handed back at shutdown while held counts (the broker counts
// every delivery).
type TxBatchHandler func(ctx context.Context, items []TxItem) ([]TxOutcome, error)

// TxHandler is the single-message form of TxBatchHandler: in ONE
// transaction it claims item.Key, applies the effect and completes it
// (with pgstore: DoTx, or ClaimTx, the effect, CompleteTx), and reports
// the outcome. Everything said on TxBatchHandler applies.
type TxHandler func(ctx context.Context, item TxItem) (TxOutcome, error)

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

// processTx hands claims to the transactional handler and settles each
// message from its outcome, or holds it.
func (c *Consumer) processTx(ctx context.Context, claims []*delivery) []*hold {
	claims, lostHs := c.liveOnly(ctx, claims)
	if len(claims) == 0 {
		return lostHs
	}
	return append(lostHs, c.processTxLive(ctx, claims)...)
}

// processTxLive is processTx once the lost deliveries are let go.
func (c *Consumer) processTxLive(ctx context.Context, claims []*delivery) []*hold {
	items := make([]TxItem, len(claims))
	for i, d := range claims {
		items[i] = TxItem{Msg: d.m, Key: d.key, Fingerprint: d.fp}
	}
	var outs []TxOutcome
	var err error
	for try := 0; ; try++ {
		outs, err = c.runTxHandler(ctx, items, claims)
		if err == nil && len(outs) != len(items) {
			err = fmt.Errorf("consumer: transactional handler returned %d outcomes for %d items", len(outs), len(items))
		}
		err = c.classify(err)
		if err == nil || c.transient(err) || !c.retryInProcess(ctx, try, err, nil) {
			break
		}
	}
	if err != nil {
		if c.transient(err) {
			// The database is unreachable (or the commit's outcome is
			// unknown): keep the messages, pause fetching, run the
			// transaction again later. No delivery is spent.
			c.pauseFetching()
			return c.holdTxOrRetry(ctx, claims, err)
		}
		c.log.Warn("consumer: transactional batch failed as a whole", "messages", len(claims), "err", err)
		var hs []*hold
		for _, d := range claims {
			hs = append(hs, c.txRetry(ctx, d, err, c.cfg.Batch.OnFailure == BatchDeadLetter)...)
		}
		return hs
	}
	settle, cancel := settlingFor(ctx, len(claims))
	defer cancel()
	var hs []*hold
	var unavailable []*delivery
	var uerr error
	for i, o := range outs {
		d := claims[i]
		switch o.Status {
		case TxDone:
			c.stats.handled.Add(1)
			c.stats.duplicates.Add(int64(len(d.followers)))
			c.ack(settle, d, false)
		case TxDuplicate:
			c.stats.duplicates.Add(int64(1 + len(d.followers)))
			c.ack(settle, d, true)
		case TxInProgress:
			hs = append(hs, c.nakOrHold(settle, d, max(o.RetryAfter, time.Millisecond), "in progress elsewhere")...)
		case TxRejected:
			reason := "rejected by the transactional handler"
			if o.Err != nil {
				reason = o.Err.Error()
			}
			hs = append(hs, c.deadLetter(ctx, d, reason)...)
		default: // TxRetry, or a status the handler should not have used
			cause := c.classify(o.Err)
			if cause == nil {
				cause = fmt.Errorf("consumer: outcome status %d", o.Status)
			}
			if c.transient(cause) {
				unavailable, uerr = append(unavailable, d), cause
				continue
			}
			hs = append(hs, c.txRetry(ctx, d, cause, false)...)
		}
	}
	if len(unavailable) > 0 {
		hs = append(hs, c.holdTxOrRetry(ctx, unavailable, uerr)...)
	}
	return hs
}

// holdTxOrRetry holds ds after the transient error err (holdTx), except
// those held for their database past MaxUnavailableHold, which take the
// failure path (an attempt counted).
func (c *Consumer) holdTxOrRetry(ctx context.Context, ds []*delivery, err error) []*hold {
	var hs []*hold
	keep := ds[:0:0]
	for _, d := range ds {
		if ferr := c.unavailableTooLong(d, err); ferr != nil {
			hs = append(hs, c.txRetry(ctx, d, ferr, false)...)
			continue
		}
		keep = append(keep, d)
	}
	if len(keep) > 0 {
		hs = append(hs, c.holdTx(keep, err))
	}
	return hs
}

// holdTx keeps ds after a transient failure of their transaction; it runs
// again later.
func (c *Consumer) holdTx(ds []*delivery, err error) *hold {
	return &hold{
		ds: ds, reason: HoldHandlerUnavailable, err: err, wait: transientWait(err),
		retry:  func(ctx context.Context) []*hold { return c.processTx(ctx, ds) },
		giveUp: func(ctx context.Context) { c.handBackAll(ctx, ds, "database unavailable at shutdown") },
	}
}

// txRetry naks d with backoff by its attempt count, or dead-letters it
// when its attempts are used up or now is set. On its last broker
// delivery it is held and retried in process instead, each retry counting
// one attempt.
func (c *Consumer) txRetry(ctx context.Context, d *delivery, cause error, now bool) []*hold {
	attempts := d.m.Delivery + d.txFails
	if now || attempts >= c.cfg.MaxAttempts {
		return c.deadLetter(ctx, d, fmt.Sprintf("transactional handler failed after %d attempt(s): %v", attempts, cause))
	}
	if c.lastDelivery(d) {
		d.txFails++
	}
	return c.nakOrHold(ctx, d, c.retryDelay(attempts), "transactional handler failed")
}

func (c *Consumer) runTxHandler(ctx context.Context, items []TxItem, ds []*delivery) (outs []TxOutcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: transactional handler panicked", "messages", len(items), "panic", r, "stack", string(debug.Stack()))
			outs, err = nil, fmt.Errorf("consumer: transactional handler panicked: %v", r)
		}
	}()
	if c.cfg.TxHandler != nil {
		ctx = broker.ExtractTrace(ctx, ds[0].m)
		o, err := c.cfg.TxHandler(ctx, items[0])
		if err != nil {
			return nil, err
		}
		return []TxOutcome{o}, nil
	}
	return c.cfg.TxBatchHandler(ctx, items)
}
