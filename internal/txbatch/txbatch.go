// Package txbatch is the body of the consumer's transactional modes on a
// SQL store's transactional methods (pgstore, mysqlstore): claim the items
// in the caller's transaction, apply the effect to the acquired ones and
// settle each of them in that same transaction, and report one
// consumer.TxOutcome per item.
package txbatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// Request is the claim request of it in a transaction that settles the
// claim before committing: nobody ever sees it in progress, so its lease
// only needs to be valid; ttl is the record's retention.
func Request(it consumer.TxItem, ttl time.Duration) idem.ClaimRequest {
	return idem.ClaimRequest{Key: it.Key, Fingerprint: it.Fingerprint, Lease: idem.DefaultLease, TTL: ttl}
}

// Ops are a store's methods on its transaction type T.
type Ops[T any] struct {
	ClaimBatch    func(ctx context.Context, tx T, reqs []idem.ClaimRequest) ([]idem.BatchResult, error)
	CompleteBatch func(ctx context.Context, tx T, cs []idem.Completion) ([]error, error)
	Release       func(ctx context.Context, tx T, key []byte, token uint64, cause string) error
	Fail          func(ctx context.Context, tx T, key []byte, token uint64, cause string) error
}

// Effect applies the effects of msgs in tx and returns one result per
// message (or nil: no results), nil when every effect is applied, a
// *consumer.PartialError naming the messages whose effect failed (and was
// not applied), or any other error when nothing may commit.
type Effect[T any] func(ctx context.Context, tx T, msgs []*broker.Message) ([][]byte, error)

// EffectError is the effect's own error: the transaction must roll back.
type EffectError struct{ Err error }

func (e *EffectError) Error() string { return e.Err.Error() }
func (e *EffectError) Unwrap() error { return e.Err }

// Run claims items in tx (the claim request of item i is req(i)), calls
// fn with the messages of the acquired ones and settles each acquired key
// in tx: completed with its result; released for a message of a
// PartialError (TxRetry with its error), or failed for good when that
// error is idem.Permanent (TxRejected); failed for good when its result is
// over idem.MaxResultLen (TxRejected with an *idem.ResultTooLargeError:
// the effect commits, and duplicates never re-run it). The outcomes hold
// once tx commits. Any error means tx must roll back: fn's own is an
// *EffectError; the others are the store's.
func Run[T any](ctx context.Context, ops Ops[T], tx T, items []consumer.TxItem, req func(i int) idem.ClaimRequest, fn Effect[T]) ([]consumer.TxOutcome, error) {
	reqs := make([]idem.ClaimRequest, len(items))
	for i := range items {
		reqs[i] = req(i)
	}
	res, err := ops.ClaimBatch(ctx, tx, reqs)
	if err != nil {
		return nil, err
	}
	if len(res) != len(items) {
		return nil, fmt.Errorf("%w: %d claim results for %d items", idem.ErrUnknownOutcome, len(res), len(items))
	}
	outs := make([]consumer.TxOutcome, len(items))
	var acq []int
	var msgs []*broker.Message
	for i, r := range res {
		o, ok := consumer.ClaimOutcome(r.Claim, r.Err)
		outs[i] = o
		if ok {
			acq = append(acq, i)
			msgs = append(msgs, items[i].Msg)
		}
	}
	if len(acq) == 0 {
		return outs, nil
	}
	results, ferr := fn(ctx, tx, msgs)
	var pe *consumer.PartialError
	if ferr != nil && !errors.As(ferr, &pe) {
		return nil, &EffectError{Err: ferr}
	}
	if results != nil && len(results) != len(msgs) {
		return nil, &EffectError{Err: fmt.Errorf("effect returned %d results for %d messages", len(results), len(msgs))}
	}
	failed := map[int]error{}
	if pe != nil {
		for j, err := range pe.Failed {
			if j < 0 || j >= len(msgs) || err == nil {
				return nil, &EffectError{Err: fmt.Errorf("PartialError names message %d of %d (error %v)", j, len(msgs), err)}
			}
			failed[j] = err
		}
	}
	cs := make([]idem.Completion, 0, len(acq))
	done := make([]int, 0, len(acq))
	for j, i := range acq {
		key, token := items[i].Key, res[i].Claim.Record.Token
		var result []byte
		if results != nil {
			result = results[j]
		}
		switch ferr := failed[j]; {
		case ferr != nil && idem.IsPermanent(ferr):
			if err := ops.Fail(ctx, tx, key, token, idem.TruncateCause(ferr.Error())); err != nil {
				return nil, err
			}
			outs[i] = consumer.TxOutcome{Status: consumer.TxRejected, Err: ferr}
		case ferr != nil:
			if err := ops.Release(ctx, tx, key, token, idem.TruncateCause(ferr.Error())); err != nil {
				return nil, err
			}
			outs[i] = consumer.TxOutcome{Status: consumer.TxRetry, Err: ferr}
		case len(result) > idem.MaxResultLen:
			tl := &idem.ResultTooLargeError{Key: key, Len: len(result)}
			if err := ops.Fail(ctx, tx, key, token, idem.TruncateCause(tl.Error())); err != nil {
				return nil, err
			}
			outs[i] = consumer.TxOutcome{Status: consumer.TxRejected, Err: tl}
		default:
			cs = append(cs, idem.Completion{Key: key, Token: token, Result: result})
			done = append(done, i)
		}
	}
	if len(cs) == 0 {
		return outs, nil
	}
	errs, err := ops.CompleteBatch(ctx, tx, cs)
	if err != nil {
		return nil, err
	}
	for k, err := range errs {
		if err != nil {
			// Our own claim, written by this transaction and locked by it:
			// nothing else can have settled it. Roll back.
			return nil, fmt.Errorf("completing key %q claimed in this transaction: %w", items[done[k]].Key, err)
		}
	}
	return outs, nil
}

// Permanent is the Effect that fails its one message for good with err:
// Run over it claims an item and marks its key failed, for a
// single-message handler whose effect failed permanently (its own
// transaction rolled back).
func Permanent[T any](err error) Effect[T] {
	return func(context.Context, T, []*broker.Message) ([][]byte, error) {
		return nil, &consumer.PartialError{Failed: map[int]error{0: err}}
	}
}

// Store is what Handler and BatchHandler need of a SQL store whose
// transaction type is T.
type Store[T any] struct {
	// DoTx claims req, runs fn and completes the key in one transaction
	// (the store's DoTx).
	DoTx func(ctx context.Context, req idem.ClaimRequest, fn func(ctx context.Context, tx T) ([]byte, error)) (idem.Claim, error)
	// RunBatch runs Run over items in a transaction of its own and commits
	// it, running it again after a transient abort.
	RunBatch func(ctx context.Context, items []consumer.TxItem, fn Effect[T]) ([]consumer.TxOutcome, error)
	// Request is the claim request of an item.
	Request func(it consumer.TxItem) idem.ClaimRequest
	// ClassifyError is the store's idem.ErrorClassifier.
	ClassifyError func(error) error
}

// Handler is the single-message transactional handler over st: DoTx with
// fn; a permanent error of fn (the transaction rolled back) marks the key
// failed in a second transaction; every error returned is classified by
// the store, whatever store the consumer's guard uses.
func Handler[T any](st Store[T], fn func(ctx context.Context, tx T, m *broker.Message) ([]byte, error)) consumer.TxHandler {
	return func(ctx context.Context, it consumer.TxItem) (consumer.TxOutcome, error) {
		c, err := st.DoTx(ctx, st.Request(it), func(ctx context.Context, tx T) ([]byte, error) {
			res, err := fn(ctx, tx, it.Msg)
			if err == nil && len(res) > idem.MaxResultLen {
				// Fail the key (below) and roll the effect back with it.
				err = idem.Permanent(fmt.Errorf("result of %d bytes exceeds MaxResultLen %d; effect rolled back", len(res), idem.MaxResultLen))
			}
			return res, err
		})
		var he *idem.HandlerError
		switch {
		case errors.As(err, &he) && idem.IsPermanent(he.Err):
			outs, err := st.RunBatch(ctx, []consumer.TxItem{it}, Permanent[T](he.Err))
			if err != nil {
				return consumer.TxOutcome{}, st.ClassifyError(err)
			}
			return outs[0], nil
		case he != nil:
			return consumer.TxOutcome{}, st.ClassifyError(he.Err)
		}
		o, acquired := consumer.ClaimOutcome(c, err)
		if acquired {
			return o, nil // the effect and the completion committed
		}
		if o.Status == consumer.TxRetry {
			return consumer.TxOutcome{}, st.ClassifyError(o.Err)
		}
		return o, nil
	}
}

// BatchHandler is the transactional batch handler over st: Run in one
// transaction per batch; every error returned is classified by the store.
func BatchHandler[T any](st Store[T], fn Effect[T]) consumer.TxBatchHandler {
	return func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		if len(items) == 0 {
			return nil, nil
		}
		outs, err := st.RunBatch(ctx, items, fn)
		if err != nil {
			var ee *EffectError
			if errors.As(err, &ee) {
				err = ee.Err
			}
			return nil, st.ClassifyError(err)
		}
		return outs, nil
	}
}
