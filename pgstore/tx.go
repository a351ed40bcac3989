package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ClaimTx claims req.Key inside the caller's transaction tx. The record is
// written by tx: it becomes visible to others, and holds the key, only when
// tx commits, and vanishes if tx rolls back. A concurrent claim of the same
// key (in or out of a transaction) waits on the row until tx ends.
//
// A server error aborts tx (PostgreSQL rejects every later statement), so
// ClaimTx returns it at once; when IsRetryable(err) (a serialization
// failure, a deadlock, or a partition that another Store value or process
// dropped and that ClaimTx has recreated) roll back and run the whole
// transaction again, as DoTx does. For LayoutTimePartitioned a missing
// partition is created on another pool connection, so the pool must have
// at least two.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	r, err := s.ref(req.Key)
	if err != nil {
		return idem.Claim{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idem.Claim{}, err
	}
	return s.claim(ctx, tx, r, req, true)
}

// ClaimBatchTx is ClaimBatch inside the caller's transaction.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	return s.claimBatch(ctx, tx, reqs, true)
}

// CompleteTx completes key with token inside the caller's transaction.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, key []byte, token uint64, result []byte) error {
	return s.mutateIn(ctx, tx, mutComplete, key, token, result)
}

// CompleteBatchTx is CompleteBatch inside the caller's transaction: the
// token-checked updates of all entries pipelined in one round trip on tx,
// each judged on its own (errs[i] is what CompleteTx would return for
// cs[i]). They take effect when tx commits. A server error aborts tx and is
// returned as the call's error.
func (s *Store) CompleteBatchTx(ctx context.Context, tx pgx.Tx, cs []idem.Completion) ([]error, error) {
	return s.completeBatch(ctx, tx, cs, true)
}

// ReleaseTx releases key with token inside the caller's transaction.
func (s *Store) ReleaseTx(ctx context.Context, tx pgx.Tx, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.mutateIn(ctx, tx, mutRelease, key, token, cause)
}

func (s *Store) mutateIn(ctx context.Context, tx pgx.Tx, m mutation, key []byte, token uint64, arg any) error {
	if m == mutComplete {
		res, _ := arg.([]byte)
		if err := idem.ValidateResult(res); err != nil {
			return err
		}
		if res == nil {
			arg = []byte{}
		}
	}
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if token > 1<<63-1 {
		return fmt.Errorf("%w: token %d was never issued", idem.ErrFenced, token)
	}
	r, err := s.ref(key)
	if err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.mutate(ctx, tx, m, r, token, arg, true)
}

// TxFunc is the caller's effect, run inside the claim's transaction. Its
// result becomes the record's Result; an error rolls everything back.
type TxFunc func(ctx context.Context, tx pgx.Tx, claim idem.Claim) (result []byte, err error)

// DoTx runs fn exactly once for req.Key, in ONE transaction with the claim
// and the completion: either the effect and the Completed record commit
// together, or neither does.
//
//   - First time: claim (Acquired), fn, complete, commit. Returns the claim
//     with the record Completed and fn's result.
//   - Duplicate of a completed key: fn is not run, nothing is committed;
//     returns OutcomeCompleted with the stored result (a replay).
//   - Concurrent duplicate inside another DoTx: waits on the row until the
//     other transaction ends, then replays (commit) or runs (rollback).
//   - Key held by a live lease of a standalone Claim: OutcomeInProgress
//     with an *idem.InProgressError; a failed key: OutcomeFailed with an
//     *idem.FailedError. fn is not run, nothing is committed, and a caller
//     that only checks the error cannot ack the message as done.
//   - fn fails: rollback, no record; the error comes back as
//     *idem.HandlerError.
//   - Serialization failure or deadlock anywhere (SQLSTATE 40001/40P01,
//     fn's statements included): the whole transaction runs again, up to
//     Config.TxRetries times; fn must therefore only touch the database
//     through tx.
//   - Connection lost during COMMIT: the outcome is resolved by waiting for
//     the old backend to end and reading the record (Completed with our
//     token = committed). If that is impossible: idem.ErrUnknownOutcome.
func (s *Store) DoTx(ctx context.Context, req idem.ClaimRequest, fn TxFunc) (idem.Claim, error) {
	return s.DoTxOptions(ctx, pgx.TxOptions{}, req, fn)
}

// DoTxOptions is DoTx with explicit transaction options (isolation level).
func (s *Store) DoTxOptions(ctx context.Context, opts pgx.TxOptions, req idem.ClaimRequest, fn TxFunc) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	r, err := s.ref(req.Key)
	if err != nil {
		return idem.Claim{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idem.Claim{}, err
	}
	if err := s.ensurePartitionsFor(ctx, []keyRef{r}); err != nil {
		return idem.Claim{}, err
	}
	for attempt := 0; ; attempt++ {
		c, err := s.doTxOnce(ctx, opts, r, req, fn)
		if err == nil || !IsRetryable(err) || attempt >= s.cfg.TxRetries || ctx.Err() != nil {
			if err != nil && IsRetryable(err) {
				var he *idem.HandlerError
				if !errors.As(err, &he) {
					err = s.mapErr(ctx, err, false) // rolled back: nothing applied
				}
			}
			return c, err
		}
		s.cfg.Logger.Debug("pgstore: DoTx retry after a transient abort", "key", string(req.Key), "attempt", attempt+1, "err", err)
	}
}

func (s *Store) doTxOnce(ctx context.Context, opts pgx.TxOptions, r keyRef, req idem.ClaimRequest, fn TxFunc) (idem.Claim, error) {
	tx, err := s.pool.BeginTx(ctx, opts)
	if err != nil {
		return idem.Claim{}, s.mapErr(ctx, err, false)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	pid := tx.Conn().PgConn().PID()
	c, err := s.claim(ctx, tx, r, req, true)
	if err != nil {
		if IsSerializationFailure(err) {
			return idem.Claim{}, err
		}
		return idem.Claim{}, err
	}
	switch c.Outcome {
	case idem.OutcomeCompleted:
		return c, nil // a duplicate commits nothing
	case idem.OutcomeInProgress:
		return c, &idem.InProgressError{Key: req.Key, LeaseUntil: c.Record.LeaseUntil}
	case idem.OutcomeFailed:
		return c, &idem.FailedError{Key: req.Key, Cause: c.Record.LastError, Attempts: c.Record.Attempts}
	}
	result, err := fn(ctx, tx, c)
	if err != nil {
		return c, &idem.HandlerError{Err: err}
	}
	if result == nil {
		result = []byte{}
	}
	if err := s.mutate(ctx, tx, mutComplete, r, c.Record.Token, result, true); err != nil {
		return c, err
	}
	done = true
	cerr := tx.Commit(ctx)
	if cerr == nil {
		c.Record.State = idem.StateCompleted
		c.Record.Result = result
		return c, nil
	}
	var pe *pgconn.PgError
	if errors.As(cerr, &pe) {
		// The server refused the commit (e.g. a serialization failure at
		// commit time): rolled back.
		if IsSerializationFailure(cerr) {
			return idem.Claim{}, cerr
		}
		return idem.Claim{}, s.mapErr(ctx, cerr, false)
	}
	// No answer to COMMIT: it may or may not have happened.
	return s.resolveCommit(ctx, pid, r, c, result, cerr)
}

// ResolveTimeout bounds how long DoTx waits for the old backend to go away
// after a connection loss during COMMIT.
var ResolveTimeout = 10 * time.Second

// resolveCommit decides a COMMIT whose answer was lost. While the old
// backend lives, its transaction may still commit; so first make sure it is
// gone (terminate it, wait for it to leave pg_stat_activity), then read the
// record: Completed with our token means the commit happened.
func (s *Store) resolveCommit(ctx context.Context, pid uint32, r keyRef, c idem.Claim, result []byte, cause error) (idem.Claim, error) {
	unknown := func(err error) (idem.Claim, error) {
		return idem.Claim{}, fmt.Errorf("%w: pgstore: commit of key %q: %w (resolving: %v)", idem.ErrUnknownOutcome, r.key, cause, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ResolveTimeout)
	defer cancel()
	for {
		var alive bool
		err := s.pool.QueryRow(rctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)
	AND (pg_terminate_backend($1) OR true)`, int32(pid)).Scan(&alive)
		if err != nil {
			return unknown(err)
		}
		if !alive {
			break
		}
		select {
		case <-rctx.Done():
			return unknown(rctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	rec, err := s.get(rctx, s.pool, r)
	if err == nil && rec.Token == c.Record.Token && rec.State == idem.StateCompleted {
		s.cfg.Logger.Warn("pgstore: commit answer lost; record shows it committed", "key", string(r.key))
		c.Record = rec
		return c, nil
	}
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		return unknown(err)
	}
	s.cfg.Logger.Warn("pgstore: commit answer lost; record shows it did not commit", "key", string(r.key))
	return idem.Claim{}, fmt.Errorf("%w: pgstore: commit of key %q lost and not applied: %w", idem.ErrUnavailable, r.key, cause)
}
