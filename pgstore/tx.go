package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
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

// FailTx marks key failed for good with token inside the caller's
// transaction (the one that claimed it, normally): duplicates get
// OutcomeFailed with cause from the commit on. The record's retention
// restarts (ExpiresAt = now + the claim's TTL), as with Fail.
func (s *Store) FailTx(ctx context.Context, tx pgx.Tx, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.mutateIn(ctx, tx, mutFail, key, token, cause)
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
	r, err := s.tokenRef(key, token)
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
//   - Inside a consumer Handler or BatchHandler, for the message's own key:
//     the key is held by the runtime's claim (consumer.HeldToken), so DoTx
//     runs fn under that claim (OutcomeAcquired, its token) and completes
//     it in the transaction: the effect and the Completed record commit
//     together, and the runtime's completion afterwards finds it done. The
//     same claim already completed (a retry after a lost answer): a replay.
//     Prefer the transactional mode (TxHandler): one transaction per
//     message instead of a claim, a transaction and a completion.
//   - fn fails: rollback, no record; the error comes back as
//     *idem.HandlerError.
//   - Serialization failure or deadlock anywhere (SQLSTATE 40001/40P01,
//     fn's statements included): the whole transaction runs again, up to
//     Config.TxRetries times; fn must therefore only touch the database
//     through tx.
//   - Connection lost during COMMIT: the outcome is resolved by asking the
//     server whether the transaction committed (pg_xact_status of its id,
//     and the record: Completed with our token). Committed: success; rolled
//     back: idem.ErrUnavailable (nothing applied, safe to run again); not
//     decided within Config.ResolveTimeout: idem.ErrUnknownOutcome. This
//     needs no backend PID, so it works behind a pooler (PgBouncer).
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
	// done maps the last attempt's error: a transient abort that is not
	// the handler's is the store's ErrUnavailable (rolled back).
	done := func(c idem.Claim, err error) (idem.Claim, error) {
		var he *idem.HandlerError
		if err != nil && IsRetryable(err) && !errors.As(err, &he) {
			err = s.mapErr(ctx, err, false)
		}
		return c, err
	}
	var c idem.Claim
	err = s.retrying(ctx, req.Key, func() (err error) {
		c, err = s.doTxOnce(ctx, opts, r, req, fn)
		return err
	})
	return done(c, err)
}

// retrying runs once, and runs it again after a transient abort
// (IsRetryable: a serialization failure, a deadlock, a partition dropped
// elsewhere) up to Config.TxRetries times, unless ctx ends.
func (s *Store) retrying(ctx context.Context, key []byte, once func() error) error {
	for attempt := 0; ; attempt++ {
		err := once()
		if err == nil || !IsRetryable(err) || attempt >= s.cfg.TxRetries || ctx.Err() != nil {
			return err
		}
		s.cfg.Logger.Debug("pgstore: transaction retry after a transient abort", "key", string(key), "attempt", attempt+1, "err", err)
		// Full jitter, 1ms doubling to 64ms: transactions that conflict
		// with each other and retry at once tend to conflict again (16
		// SERIALIZABLE ones on one row starved one of them through 50
		// immediate retries now and then).
		select {
		case <-ctx.Done():
			return err
		case <-time.After(rand.N(time.Millisecond << min(attempt, 6))):
		}
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
	c, err := s.claim(ctx, tx, r, req, true)
	if err != nil {
		return idem.Claim{}, err
	}
	switch c.Outcome {
	case idem.OutcomeCompleted:
		return c, nil // a duplicate commits nothing
	case idem.OutcomeInProgress:
		if !heldByCaller(ctx, req.Key, c.Record.Token) {
			return c, &idem.InProgressError{Key: req.Key, LeaseUntil: c.Record.LeaseUntil, Lease: req.Lease}
		}
		// The consumer runtime's claim under which the caller runs: the
		// effect runs under it and the completion below (checked by its
		// token, on the row this statement locked) settles it in this
		// transaction. The runtime's own Complete then finds it done.
		c.Outcome = idem.OutcomeAcquired
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
	var xid string
	if err := s.mutateX(ctx, tx, mutComplete, r, c.Record.Token, result, true, &xid); err != nil {
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
	if errors.As(cerr, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC" {
		// The server refused the commit (e.g. a serialization failure at
		// commit time): rolled back. (A FATAL error ends the session, and
		// may come from another cause while COMMIT is on its way: resolve.)
		if IsSerializationFailure(cerr) {
			return idem.Claim{}, cerr
		}
		return idem.Claim{}, s.mapErr(ctx, cerr, false)
	}
	// No answer to COMMIT: it may or may not have happened.
	return s.resolveCommit(ctx, xid, r, c, cerr)
}

// heldByCaller reports that token is the claim of key under which the
// consumer runtime runs the handler that got ctx (consumer.HeldToken).
func heldByCaller(ctx context.Context, key []byte, token uint64) bool {
	t, ok := consumer.HeldToken(ctx, key)
	return ok && t == token
}

// resolveCommit decides a COMMIT whose answer was lost, from the
// transaction's id (xid, read in the transaction before COMMIT) and the
// record, on another connection:
//
//   - the record is Completed with our token: the commit happened (a
//     reader cannot see an uncommitted change, and tokens are unique);
//   - otherwise pg_xact_status(xid) = 'aborted': it never will (nothing
//     applied);
//   - 'in progress': the old session still holds the transaction (its
//     COMMIT is on the way, or it waits for one that was lost, which
//     CommitIdleTimeout ends): ask again;
//   - anything else ('committed' while the record does not show it, which
//     only a failover to a server without our transaction, reusing its
//     id, or a change of the record since could give; NULL; an error):
//     keep asking until ResolveTimeout, then idem.ErrUnknownOutcome.
//
// Unlike terminating the old backend by its PID, this needs no PID, which
// a pooler (PgBouncer) does not give out and which another session may
// have taken by the time it is used.
func (s *Store) resolveCommit(ctx context.Context, xid string, r keyRef, c idem.Claim, cause error) (idem.Claim, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ResolveTimeout)
	defer cancel()
	var last string
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		var status *string
		err := s.pool.QueryRow(rctx, "SELECT pg_xact_status($1::text::xid8)", xid).Scan(&status)
		if err == nil {
			var rec idem.Record
			rec, err = s.get(rctx, s.pool, r)
			switch {
			case err == nil && rec.Token == c.Record.Token && rec.State == idem.StateCompleted:
				s.cfg.Logger.Warn("pgstore: commit answer lost; the transaction committed", "key", string(r.key), "xid", xid)
				c.Record = rec
				return c, nil
			case err != nil && !errors.Is(err, idem.ErrNotFound):
			case status != nil && *status == "aborted":
				s.cfg.Logger.Warn("pgstore: commit answer lost; the transaction rolled back", "key", string(r.key), "xid", xid)
				return idem.Claim{}, fmt.Errorf("%w: pgstore: commit of key %q lost and not applied (transaction %s rolled back): %w", idem.ErrUnavailable, r.key, xid, cause)
			default:
				err = nil
			}
		}
		switch {
		case err != nil:
			last = err.Error()
		case status == nil:
			last = "pg_xact_status is NULL (transaction id too old)"
		default:
			last = "transaction " + xid + " " + *status
		}
		s.cfg.Logger.Debug("pgstore: resolving a lost commit", "key", string(r.key), "xid", xid, "state", last)
		select {
		case <-rctx.Done():
			return idem.Claim{}, fmt.Errorf("%w: pgstore: commit of key %q: %w (still undecided after %s: %s)", idem.ErrUnknownOutcome, r.key, cause, s.cfg.ResolveTimeout, last)
		case <-time.After(delay):
		}
	}
}
