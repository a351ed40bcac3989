package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/internal/txbatch"
)

// MessageTxFunc is a consumer's effect for one message, run inside the
// transaction that claims and completes the message's key. Run every
// statement of the effect on tx, and follow DoTx's rules (never end the
// transaction yourself, no statement that commits implicitly). Its result
// is stored with the record and replayed to duplicates. Return
// idem.Permanent(err) for an error no retry can fix (the key is marked
// failed, the message dead-lettered), and a driver's error as it is (an
// unreachable database holds the message and spends no attempt). It may
// run more than once (a deadlock runs the whole transaction again); only
// one run commits.
type MessageTxFunc func(ctx context.Context, tx *sql.Tx, m *broker.Message) (result []byte, err error)

// BatchTxFunc is a consumer's effect for the new messages of a batch (the
// ones whose keys the transaction acquired), run inside the transaction
// that claims and completes them. It returns one result per message (or
// nil), and nil, a *consumer.PartialError naming the messages whose effect
// failed and was not applied (their keys are released, or failed for good
// for an idem.Permanent error, in the same transaction, and the others
// commit), or any other error: the transaction rolls back and nothing
// happened.
type BatchTxFunc func(ctx context.Context, tx *sql.Tx, msgs []*broker.Message) (results [][]byte, err error)

// TxHandlerConfig configures TxHandler and TxBatchHandler. Zero values take
// the defaults.
type TxHandlerConfig struct {
	// TTL is how long a completed or failed record is kept, from its
	// commit. Keep it above the broker's redelivery window. Default
	// idem.DefaultTTL.
	TTL time.Duration
	// TxOptions are TxBatchHandler's transaction options (isolation
	// level); TxHandler runs DoTx's default transaction.
	TxOptions *sql.TxOptions
}

// Validate reports a bad configuration, wrapping idem.ErrInvalidArgument.
func (c TxHandlerConfig) Validate() error {
	if c.TTL != 0 {
		if err := idem.ValidateTTL(c.TTL); err != nil {
			return fmt.Errorf("mysqlstore: TxHandlerConfig.TTL: %w", err)
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
// duplicate is acked without running fn; a key held elsewhere is nak'ed
// until the holder's lease ends; a failed key, a payload that differs from
// the first one under the same key, and fn's idem.Permanent errors are
// dead-lettered (the key is then marked failed, in a second transaction,
// so duplicates never run it; so is a result over idem.MaxResultLen, whose
// effect rolls back). Any other error of fn rolls everything back and is
// retried with backoff, or held while the database cannot be reached
// (classified with s.ClassifyError, whatever store the consumer's guard
// uses).
func TxHandler(s *Store, cfg TxHandlerConfig, fn MessageTxFunc) (consumer.TxHandler, error) {
	st, err := s.txStore("TxHandler", cfg, fn != nil)
	if err != nil {
		return nil, err
	}
	return txbatch.Handler(st, fn), nil
}

// TxBatchHandler is the consumer's transactional batch mode on s
// (consumer.Config.TxBatchHandler): ONE transaction (Store.BeginTx, so that
// nothing commits without its records whatever fn does after an error)
// claims every key of the batch (ClaimBatchTx), runs fn on the messages it
// acquired and settles them (CompleteTx; ReleaseTx or FailTx for those of
// a *consumer.PartialError; FailTx for a result over idem.MaxResultLen,
// whose effect commits). Outcomes are as for TxHandler, per message. A
// deadlock, or a transaction the server ended under fn (ErrTxEnded), runs
// the whole transaction again (Config.TxRetries). A COMMIT whose answer
// was lost is idem.ErrUnknownOutcome: the runtime holds the batch and runs
// it again, which finds the keys of a committed batch completed.
func TxBatchHandler(s *Store, cfg TxHandlerConfig, fn BatchTxFunc) (consumer.TxBatchHandler, error) {
	st, err := s.txStore("TxBatchHandler", cfg, fn != nil)
	if err != nil {
		return nil, err
	}
	return txbatch.BatchHandler(st, txbatch.Effect[*sql.Tx](fn)), nil
}

// txStore checks the arguments of TxHandler and TxBatchHandler and returns
// s as txbatch needs it.
func (s *Store) txStore(what string, cfg TxHandlerConfig, haveFn bool) (txbatch.Store[*sql.Tx], error) {
	if s == nil || !haveFn {
		return txbatch.Store[*sql.Tx]{}, fmt.Errorf("%w: mysqlstore: %s needs a store and a function", idem.ErrInvalidArgument, what)
	}
	if err := cfg.Validate(); err != nil {
		return txbatch.Store[*sql.Tx]{}, err
	}
	cfg = cfg.withDefaults()
	return txbatch.Store[*sql.Tx]{
		DoTx: func(ctx context.Context, req idem.ClaimRequest, fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (idem.Claim, error) {
			return s.DoTx(ctx, req, func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) { return fn(ctx, tx) })
		},
		RunBatch: func(ctx context.Context, items []consumer.TxItem, fn txbatch.Effect[*sql.Tx]) ([]consumer.TxOutcome, error) {
			return s.runTxBatch(ctx, cfg, items, fn)
		},
		Request:       func(it consumer.TxItem) idem.ClaimRequest { return txbatch.Request(it, cfg.TTL) },
		ClassifyError: s.ClassifyError,
	}, nil
}

// runTxBatch runs txbatch.Run in a Tx of its own and commits it, running
// it all again after a deadlock.
func (s *Store) runTxBatch(ctx context.Context, cfg TxHandlerConfig, items []consumer.TxItem, fn txbatch.Effect[*sql.Tx]) ([]consumer.TxOutcome, error) {
	ops := txbatch.Ops[*sql.Tx]{
		ClaimBatch: s.ClaimBatchTx,
		CompleteBatch: func(ctx context.Context, tx *sql.Tx, cs []idem.Completion) ([]error, error) {
			errs := make([]error, len(cs))
			for i, c := range cs {
				if err := s.CompleteTx(ctx, tx, c.Key, c.Token, c.Result); err != nil {
					if !errors.Is(err, idem.ErrFenced) && !errors.Is(err, idem.ErrNotFound) {
						return nil, err
					}
					errs[i] = err
				}
			}
			return errs, nil
		},
		Release: s.ReleaseTx,
		Fail:    s.FailTx,
	}
	var outs []consumer.TxOutcome
	err := s.retrying(ctx, func() error {
		tx, err := s.BeginTx(ctx, cfg.TxOptions)
		if err != nil {
			return err
		}
		o, err := txbatch.Run(ctx, ops, tx.Tx, items, func(i int) idem.ClaimRequest { return txbatch.Request(items[i], cfg.TTL) }, fn)
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		outs = o
		return nil
	})
	return outs, err
}
