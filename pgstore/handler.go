package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/internal/txbatch"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MessageTxFunc is a consumer's effect for one message, run inside the
// transaction that claims and completes the message's key. Run every
// statement of the effect on tx. Its result is stored with the record and
// replayed to duplicates. Return idem.Permanent(err) for an error no retry
// can fix (the key is marked failed, the message dead-lettered), and a
// driver's error as it is (an unreachable database holds the message and
// spends no attempt). It may run more than once (a serialization failure
// or a deadlock runs the whole transaction again); only one run commits.
type MessageTxFunc func(ctx context.Context, tx pgx.Tx, m *broker.Message) (result []byte, err error)

// BatchTxFunc is a consumer's effect for the new messages of a batch (the
// ones whose keys the transaction acquired; duplicates and keys held
// elsewhere are left out), run inside the transaction that claims and
// completes them. It returns one result per message (or nil), and nil, a
// *consumer.PartialError naming the messages whose effect failed and was
// not applied (their keys are released, or failed for good for an
// idem.Permanent error, in the same transaction, and the others commit),
// or any other error: the transaction rolls back and nothing happened.
type BatchTxFunc func(ctx context.Context, tx pgx.Tx, msgs []*broker.Message) (results [][]byte, err error)

// TxHandlerConfig configures TxHandler and TxBatchHandler. Zero values take
// the defaults.
type TxHandlerConfig struct {
	// TTL is how long a completed or failed record is kept, from its
	// commit. Keep it above the broker's redelivery window. Default
	// idem.DefaultTTL.
	TTL time.Duration
	// TxOptions are the transaction's options (isolation level...).
	TxOptions pgx.TxOptions
}

// Validate reports a bad configuration, wrapping idem.ErrInvalidArgument.
func (c TxHandlerConfig) Validate() error {
	if c.TTL != 0 {
		if err := idem.ValidateTTL(c.TTL); err != nil {
			return fmt.Errorf("pgstore: TxHandlerConfig.TTL: %w", err)
		}
	}
	return nil
}

func (c TxHandlerConfig) withDefaults() TxHandlerConfig {
	if c.TTL == 0 {
		c.TTL = idem.DefaultTTL
	}
	return c
}

// TxHandler is the consumer's single-message transactional mode on s
// (consumer.Config.TxHandler): for each message, ONE transaction claims its
// key (DoTx), runs fn and completes the key, so the effect and its record
// commit together or not at all. The runtime then acks the message; a
// duplicate is acked without running fn; a key held by a standalone claim
// elsewhere is nak'ed until its lease ends; a failed key, a payload that
// differs from the first one under the same key, and fn's idem.Permanent
// errors are dead-lettered (the key is then marked failed, in a second
// transaction, so duplicates never run it; so is a result over
// idem.MaxResultLen, whose effect rolls back). Any other error of fn rolls
// everything back and is retried with backoff, or held while the database
// cannot be reached (classified with s.ClassifyError, whatever store the
// consumer's guard uses).
func TxHandler(s *Store, cfg TxHandlerConfig, fn MessageTxFunc) (consumer.TxHandler, error) {
	st, err := s.txStore("TxHandler", cfg, fn != nil)
	if err != nil {
		return nil, err
	}
	return txbatch.Handler(st, fn), nil
}

// TxBatchHandler is the consumer's transactional batch mode on s
// (consumer.Config.TxBatchHandler): ONE transaction claims every key of
// the batch (ClaimBatchTx), runs fn on the messages it acquired and
// settles them (CompleteBatchTx, one round trip; ReleaseTx or FailTx for
// those of a *consumer.PartialError; FailTx for a result over
// idem.MaxResultLen, whose effect commits). Outcomes are as for TxHandler,
// per message. A serialization failure or deadlock runs the whole
// transaction again (Config.TxRetries). A COMMIT whose answer was lost is
// reported as idem.ErrUnknownOutcome: the runtime holds the batch and runs
// it again, which finds the keys of a committed batch completed.
func TxBatchHandler(s *Store, cfg TxHandlerConfig, fn BatchTxFunc) (consumer.TxBatchHandler, error) {
	st, err := s.txStore("TxBatchHandler", cfg, fn != nil)
	if err != nil {
		return nil, err
	}
	return txbatch.BatchHandler(st, txbatch.Effect[pgx.Tx](fn)), nil
}

// txStore checks the arguments of TxHandler and TxBatchHandler and returns
// s as txbatch needs it.
func (s *Store) txStore(what string, cfg TxHandlerConfig, haveFn bool) (txbatch.Store[pgx.Tx], error) {
	if s == nil || !haveFn {
		return txbatch.Store[pgx.Tx]{}, fmt.Errorf("%w: pgstore: %s needs a store and a function", idem.ErrInvalidArgument, what)
	}
	if err := cfg.Validate(); err != nil {
		return txbatch.Store[pgx.Tx]{}, err
	}
	cfg = cfg.withDefaults()
	ops := txbatch.Ops[pgx.Tx]{ClaimBatch: s.ClaimBatchTx, CompleteBatch: s.CompleteBatchTx, Release: s.ReleaseTx, Fail: s.FailTx}
	return txbatch.Store[pgx.Tx]{
		DoTx: func(ctx context.Context, req idem.ClaimRequest, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (idem.Claim, error) {
			return s.DoTxOptions(ctx, cfg.TxOptions, req, func(ctx context.Context, tx pgx.Tx, _ idem.Claim) ([]byte, error) { return fn(ctx, tx) })
		},
		RunBatch: func(ctx context.Context, items []consumer.TxItem, fn txbatch.Effect[pgx.Tx]) (outs []consumer.TxOutcome, err error) {
			err = s.inTx(ctx, cfg.TxOptions, items[0].Key, func(ctx context.Context, tx pgx.Tx) (err error) {
				outs, err = txbatch.Run(ctx, ops, tx, items, func(i int) idem.ClaimRequest { return txbatch.Request(items[i], cfg.TTL) }, fn)
				return err
			})
			return outs, err
		},
		Request:       func(it consumer.TxItem) idem.ClaimRequest { return txbatch.Request(it, cfg.TTL) },
		ClassifyError: s.ClassifyError,
	}, nil
}

// inTx runs body in a transaction and commits it, running it all again
// after a transient abort (retrying). A COMMIT the server refused rolled
// back; one whose answer was lost is idem.ErrUnknownOutcome.
func (s *Store) inTx(ctx context.Context, opts pgx.TxOptions, key []byte, body func(ctx context.Context, tx pgx.Tx) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.retrying(ctx, key, func() error {
		tx, err := s.pool.BeginTx(ctx, opts)
		if err != nil {
			return s.mapErr(ctx, err, false)
		}
		if err := body(ctx, tx); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return err
		}
		cerr := tx.Commit(ctx)
		if cerr == nil {
			return nil
		}
		var pe *pgconn.PgError
		if errors.As(cerr, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC" {
			if IsSerializationFailure(cerr) {
				return cerr // rolled back: run it again
			}
			return s.mapErr(ctx, cerr, false)
		}
		return fmt.Errorf("%w: pgstore: commit: %w", idem.ErrUnknownOutcome, cerr)
	})
}
