package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
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

// FailTx marks a claim failed for good inside the caller's transaction
// (normally the one that claimed it): duplicates get OutcomeFailed with
// cause once tx commits, and the record's retention restarts (ExpiresAt =
// now + the claim's TTL), as with Fail.
func (s *Store) FailTx(ctx context.Context, tx *sql.Tx, key []byte, token uint64, cause string) error {
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
	return s.finish(ctx, tx, key, token, failOp(cause))
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
//   - Inside a consumer Handler or BatchHandler, for the message's own key:
//     the key is held by the runtime's claim (consumer.HeldToken), so fn
//     runs under that claim (OutcomeAcquired, its token) and the claim is
//     completed in the transaction; the runtime's completion afterwards
//     finds it done. That claim already completed (a retry after a lost
//     answer): a replay. Prefer the transactional mode (TxHandler): one
//     transaction per message instead of a claim, a transaction and a
//     completion.
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
	var c idem.Claim
	err = s.retrying(ctx, func() (err error) {
		c, err = s.doTxOnce(ctx, req, l, fn)
		return err
	})
	if err != nil && IsRetryable(err) {
		return idem.Claim{}, err
	}
	return c, err
}

// retrying runs once, and runs it again after a deadlock or ErrTxEnded
// (IsRetryable: everything was rolled back) up to Config.TxRetries times.
// Retries used up, the error is mapped (rolled back: nothing applied);
// ctx ending first returns the last error as it is.
func (s *Store) retrying(ctx context.Context, once func() error) error {
	for attempt := 0; ; attempt++ {
		err := once()
		if err == nil || !IsRetryable(err) {
			return err
		}
		if attempt >= s.cfg.TxRetries {
			return mapErr(err, false)
		}
		s.cfg.Logger.DebugContext(ctx, "mysqlstore: transaction deadlock, retrying", "attempt", attempt+1)
		t := time.NewTimer(time.Duration(1+rand.IntN(5<<attempt)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func (s *Store) doTxOnce(ctx context.Context, req idem.ClaimRequest, l loc, fn TxFunc) (idem.Claim, error) {
	conn, err := s.conn(ctx)
	if err != nil {
		return idem.Claim{}, err
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		discard(conn)
		return idem.Claim{}, mapErr(err, false)
	}
	ended := false      // tx.Commit or tx.Rollback was called
	serverDone := false // ... and the server acknowledged it: no transaction is open
	guarded := false    // the session runs with autocommit off
	defer func() {
		if !ended {
			serverDone = tx.Rollback() == nil
		}
		releaseConn(conn, guarded, serverDone)
	}()
	c, err := s.claimOne(ctx, tx, req, l, false)
	if err != nil {
		return idem.Claim{}, err // a deadlock here is retried by DoTx
	}
	switch c.Outcome {
	case idem.OutcomeCompleted:
		return c, nil // duplicate: commit nothing
	case idem.OutcomeInProgress:
		if t, ok := consumer.HeldToken(ctx, req.Key); !ok || t != c.Record.Token {
			return c, &idem.InProgressError{Key: req.Key, LeaseUntil: c.Record.LeaseUntil, Lease: req.Lease}
		}
		// The consumer runtime's claim under which the caller runs (the
		// claim statement locked its row): fn runs under it and the
		// complete below, checked by its token, settles it in this
		// transaction. The runtime's own Complete then finds it done.
		c.Outcome = idem.OutcomeAcquired
	case idem.OutcomeFailed:
		return c, &idem.FailedError{Key: req.Key, Cause: c.Record.LastError, Attempts: c.Record.Attempts}
	}
	// From here until COMMIT no statement on this session commits by
	// itself: if InnoDB rolls the transaction back under fn (a deadlock, a
	// lock wait timeout with innodb_rollback_on_timeout, a KILL QUERY of
	// the whole transaction), whatever fn runs next starts a new, implicit
	// transaction instead of autocommitting, and the complete below, which
	// finds no claim in it, makes us roll that back. Setting autocommit=0
	// inside a transaction does not commit it.
	if _, err := tx.ExecContext(ctx, "SET SESSION autocommit = 0"); err != nil {
		return idem.Claim{}, mapErr(err, false)
	}
	guarded = true
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
	// The complete is the check: it changes our claim's row only if this
	// is still the transaction that made the claim (the row lock keeps
	// everyone else off it until we end).
	if err := s.finish(ctx, tx, req.Key, c.Record.Token, completeOp(result)); err != nil {
		if errors.Is(err, idem.ErrNotFound) || errors.Is(err, idem.ErrFenced) {
			return idem.Claim{}, txEnded(err)
		}
		return c, err
	}
	err = tx.Commit()
	ended, serverDone = true, err == nil
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

// ErrTxEnded: the server ended the transaction (rolled it back: a deadlock,
// a lock wait timeout with innodb_rollback_on_timeout) before it could
// commit, and statements ran after that. Nothing was committed: DoTx and
// Tx.Commit roll back whatever ran after the end. Run the whole transaction
// again (IsRetryable reports true; DoTx does it itself). It matches
// idem.ErrUnavailable.
var ErrTxEnded = errors.New("mysqlstore: the server rolled the transaction back before it could commit")

func txEnded(cause error) error {
	return fmt.Errorf("%w: %w (%w)", idem.ErrUnavailable, ErrTxEnded, cause)
}

// releaseConn hands a transaction's connection back to the pool. A session
// that ran with autocommit off goes back only after autocommit is on again,
// and only if the server acknowledged the COMMIT or ROLLBACK (serverDone):
// with no transaction open, turning autocommit on commits nothing. In every
// other case the connection is closed, and the server rolls back whatever
// it still had open.
func releaseConn(conn *sql.Conn, guarded, serverDone bool) {
	if !serverDone {
		discard(conn)
		return
	}
	if guarded {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := conn.ExecContext(ctx, "SET SESSION autocommit = 1")
		cancel()
		if err != nil {
			discard(conn)
			return
		}
	}
	conn.Close()
}

// discard closes conn instead of returning it to the pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// Tx is a transaction for ClaimTx, ClaimBatchTx, CompleteTx and ReleaseTx
// in which an effect can never commit without its records, whatever runs on
// it after an error. Get one from Store.BeginTx, pass tx.Tx to the store's
// *Tx methods and to your own statements, and end it with tx.Commit or
// tx.Rollback (these, not tx.Tx.Commit / tx.Tx.Rollback, which would leave
// the connection checked out).
//
// Why: when InnoDB rolls a transaction back by itself (deadlock 1213; lock
// wait timeout 1205 with innodb_rollback_on_timeout), MariaDB runs the
// session's next statements in autocommit, so an effect retried by an ORM
// after the error commits at once, without the claim that was rolled back
// (PostgreSQL refuses statements in an aborted transaction instead). A Tx
// runs its session with autocommit off, so such statements only open a new
// transaction; Commit first checks that the transaction is still the one
// BeginTx started (a savepoint set at BEGIN still exists) and otherwise
// rolls back and returns ErrTxEnded.
//
// A *sql.Tx from DB.BeginTx has no such protection: after any error that
// IsRetryable reports on it, roll it back and run the whole transaction
// again, never a single statement.
type Tx struct {
	*sql.Tx
	conn *sql.Conn
	mu   sync.Mutex
	done bool
}

// txSavepoint marks the transaction a Tx started; it disappears with it.
const txSavepoint = "idem_tx"

// BeginTx starts a Tx on a connection of its own (see Tx). opts as for
// sql.DB.BeginTx; ctx bounds the whole transaction, as there.
func (s *Store) BeginTx(ctx context.Context, opts *sql.TxOptions) (*Tx, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	conn, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "SET SESSION autocommit = 0"); err != nil {
		discard(conn)
		return nil, mapErr(err, false)
	}
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		discard(conn)
		return nil, mapErr(err, false)
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+txSavepoint); err != nil {
		_ = tx.Rollback()
		discard(conn)
		return nil, mapErr(err, false)
	}
	return &Tx{Tx: tx, conn: conn}, nil
}

// Commit commits the transaction if it is still the one BeginTx started.
// If the server ended it before (see Tx), it rolls back whatever ran since
// and returns an error matching ErrTxEnded and idem.ErrUnavailable: nothing
// was committed, run the whole transaction again. A connection lost during
// COMMIT gives idem.ErrUnknownOutcome (read the records to learn what
// happened).
func (t *Tx) Commit() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := t.Tx.ExecContext(ctx, "RELEASE SAVEPOINT "+txSavepoint); err != nil {
		releaseConn(t.conn, true, t.Tx.Rollback() == nil)
		if isServerErr(err, erSavepointMissing) {
			return txEnded(err)
		}
		return mapErr(err, false)
	}
	err := t.Tx.Commit()
	releaseConn(t.conn, true, err == nil)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) {
			return mapErr(err, false) // the server answered: not committed
		}
		return mapErr(err, true)
	}
	return nil
}

// Rollback rolls the transaction back; after Commit it returns
// sql.ErrTxDone, so it can be deferred.
func (t *Tx) Rollback() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	err := t.Tx.Rollback()
	releaseConn(t.conn, true, err == nil)
	return err
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
