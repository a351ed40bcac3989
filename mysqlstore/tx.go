package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
)

// ClaimTx claims req inside the caller's transaction. The claim statement
// locks the record's row until tx ends, so a concurrent claim of the same key
// (in or out of a transaction) waits for tx: after a COMMIT it sees the
// completed record, after a ROLLBACK the key as it was before (absent for a
// new key). A deadlock error (IsRetryable) means tx was rolled back: run the
// whole transaction again.
func (s *Store) ClaimTx(ctx context.Context, tx *sql.Tx, req idem.ClaimRequest) (idem.Claim, error) {
	if tx == nil {
		return idem.Claim{}, fmt.Errorf("%w: mysqlstore: nil tx", idem.ErrInvalidArgument)
	}
	l, err := s.prepareClaim(ctx, req)
	if err != nil {
		return idem.Claim{}, err
	}
	return s.claimOne(ctx, tx, req, l, false)
}

// CompleteTx completes a claim inside the caller's transaction (normally
// the one that ran ClaimTx and the effect): the record turns Completed in
// the same commit as the effect.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, key []byte, token uint64, result []byte) error {
	if tx == nil {
		return fmt.Errorf("%w: mysqlstore: nil tx", idem.ErrInvalidArgument)
	}
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateResult(result); err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.finish(ctx, tx, key, token, completeOp(result))
}

// ReleaseTx releases a claim inside the caller's transaction.
func (s *Store) ReleaseTx(ctx context.Context, tx *sql.Tx, key []byte, token uint64, cause string) error {
	if tx == nil {
		return fmt.Errorf("%w: mysqlstore: nil tx", idem.ErrInvalidArgument)
	}
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.finish(ctx, tx, key, token, releaseOp(cause))
}

// ClaimBatchTx is ClaimBatch inside the caller's transaction: the rows stay
// locked until tx ends, so a batch consumer can apply every acquired
// message's effect and CompleteTx them in the same commit. Statements run
// one after another on tx (sharded layouts too). A deadlock
// (IsRetryable) rolled tx back: run the whole transaction again.
func (s *Store) ClaimBatchTx(ctx context.Context, tx *sql.Tx, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: mysqlstore: nil tx", idem.ErrInvalidArgument)
	}
	return s.claimBatch(ctx, tx, reqs)
}

// TxFunc is the effect run by DoTx inside the transaction, given the
// acquired claim (its token, attempts). Its result is stored with the
// completed record and replayed to duplicates. (Same shape as pgstore's.)
type TxFunc func(ctx context.Context, tx *sql.Tx, claim idem.Claim) (result []byte, err error)

// DoTx runs fn exactly once per key, atomically with its idempotency record:
// BEGIN; claim (row locked); fn(tx); complete; COMMIT. The effect and the
// completed record commit together or not at all.
//
//   - First run: fn runs; (Claim{OutcomeAcquired, completed record}, nil).
//   - Duplicate of a completed key: fn does not run and nothing is
//     committed; (Claim{OutcomeCompleted, record}, nil): Record.Result is
//     the first run's result.
//   - A concurrent DoTx on the same key: waits for the row lock (at most
//     LockWait or innodb_lock_wait_timeout, then idem.ErrInProgress), then
//     sees the outcome of the first.
//   - Key held by a standalone Claim with a live lease: idem.ErrInProgress
//     (an *idem.InProgressError unless the row lock timed out).
//   - Key failed: an *idem.FailedError. Fingerprint conflict:
//     idem.ErrFingerprintMismatch.
//   - fn returns an error: ROLLBACK, nothing is recorded, *idem.HandlerError.
//   - Deadlock (1213) anywhere in the transaction, fn's statements included:
//     everything was rolled back; DoTx runs it again (TxRetries times), so
//     fn may run more than once but only one run commits. fn must keep its
//     effects inside tx.
//   - Connection lost during COMMIT: the record is read back (a locking read
//     that waits until the server has finished the old session): completed
//     with our token means committed; otherwise idem.ErrUnavailable (rolled
//     back). If even that read fails: idem.ErrUnknownOutcome.
func (s *Store) DoTx(ctx context.Context, req idem.ClaimRequest, fn TxFunc) (idem.Claim, error) {
	if fn == nil {
		return idem.Claim{}, fmt.Errorf("%w: mysqlstore: nil TxFunc", idem.ErrInvalidArgument)
	}
	l, err := s.prepareClaim(ctx, req)
	if err != nil {
		return idem.Claim{}, err
	}
	for attempt := 0; ; attempt++ {
		c, err := s.doTxOnce(ctx, req, l, fn)
		if err == nil || !IsRetryable(err) {
			return c, err
		}
		if attempt >= s.cfg.TxRetries {
			return idem.Claim{}, mapErr(err, false) // rolled back: nothing applied
		}
		s.cfg.Logger.DebugContext(ctx, "mysqlstore: DoTx deadlock, retrying", "attempt", attempt+1)
		t := time.NewTimer(time.Duration(1+rand.IntN(5<<attempt)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return idem.Claim{}, err
		case <-t.C:
		}
	}
}

func (s *Store) doTxOnce(ctx context.Context, req idem.ClaimRequest, l loc, fn TxFunc) (idem.Claim, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return idem.Claim{}, mapErr(err, false)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	c, err := s.claimOne(ctx, tx, req, l, false)
	if err != nil {
		return idem.Claim{}, err // a deadlock here is retried by DoTx
	}
	switch c.Outcome {
	case idem.OutcomeCompleted:
		return c, nil // duplicate: commit nothing
	case idem.OutcomeInProgress:
		return c, &idem.InProgressError{Key: req.Key, LeaseUntil: c.Record.LeaseUntil}
	case idem.OutcomeFailed:
		return c, &idem.FailedError{Key: req.Key, Cause: c.Record.LastError, Attempts: c.Record.Attempts}
	}
	result, err := runFn(ctx, tx, c, fn)
	if err != nil {
		if IsRetryable(err) {
			return idem.Claim{}, err
		}
		return c, &idem.HandlerError{Err: err}
	}
	if err := idem.ValidateResult(result); err != nil {
		return c, err
	}
	if err := s.finish(ctx, tx, req.Key, c.Record.Token, completeOp(result)); err != nil {
		return c, err
	}
	err = tx.Commit()
	committed = true
	if err != nil {
		return s.resolveCommit(ctx, req, l, c, err)
	}
	rec := c.Record
	rec.State = idem.StateCompleted
	rec.Result = result
	if len(result) == 0 {
		rec.Result = nil
	}
	return idem.Claim{Outcome: idem.OutcomeAcquired, Record: rec}, nil
}

// runFn calls fn and turns a panic into an error after rolling back (the
// deferred Rollback in doTxOnce) so the connection is not left mid-transaction.
func runFn(ctx context.Context, tx *sql.Tx, c idem.Claim, fn TxFunc) (res []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn(ctx, tx, c)
}

// resolveCommit decides what a failed COMMIT did by reading the record.
func (s *Store) resolveCommit(ctx context.Context, req idem.ClaimRequest, l loc, c idem.Claim, commitErr error) (idem.Claim, error) {
	var me *mysql.MySQLError
	if errors.As(commitErr, &me) {
		// The server answered: the commit did not happen.
		return idem.Claim{}, mapErr(commitErr, false)
	}
	if ctx.Err() != nil && errors.Is(commitErr, sql.ErrTxDone) {
		return idem.Claim{}, ctx.Err() // database/sql rolled back on cancel
	}
	rctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
	}
	s.cfg.Logger.WarnContext(ctx, "mysqlstore: commit outcome unknown, reading the record", "err", commitErr)
	rec, err := s.readLocked(rctx, req.Key, l)
	switch {
	case err == nil && rec.Token == c.Record.Token && rec.State == idem.StateCompleted:
		return idem.Claim{Outcome: idem.OutcomeAcquired, Record: rec}, nil
	case err == nil || errors.Is(err, idem.ErrNotFound):
		return idem.Claim{}, fmt.Errorf("%w: mysqlstore: commit lost and rolled back (record has no completion by token %d): %w", idem.ErrUnavailable, c.Record.Token, commitErr)
	}
	return idem.Claim{}, fmt.Errorf("%w: mysqlstore: commit lost and the record could not be read: %w (%w)", idem.ErrUnknownOutcome, commitErr, err)
}

// readLocked reads the record with a locking read in its own transaction,
// which waits for any transaction still holding the row (a dying session
// whose COMMIT may be in flight) to end.
func (s *Store) readLocked(ctx context.Context, key []byte, l loc) (idem.Record, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return idem.Record{}, mapErr(err, false)
	}
	defer tx.Rollback()
	return s.get(ctx, tx, key, l, " LOCK IN SHARE MODE")
}
