package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes the store acts on.
const (
	codeUniqueViolation      = "23505"
	codeCheckViolation       = "23514" // also "no partition of relation found for row"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeDuplicateTable       = "42P07"
	codeUndefinedTable       = "42P01"
	codeLockNotAvailable     = "55P03"
)

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// IsSerializationFailure reports whether err is a serialization failure or
// a deadlock: the transaction was rolled back and may be run again.
func IsSerializationFailure(err error) bool {
	c := pgCode(err)
	return c == codeSerializationFailure || c == codeDeadlockDetected
}

// IsRetryable reports whether err, from a transaction that pgstore took
// part in (DoTx's own, or the caller's around ClaimTx and ClaimBatchTx),
// means the transaction was rolled back for a transient reason and may be
// run again at once: a serialization failure, a deadlock, or a partition
// that was missing and that pgstore has recreated.
func IsRetryable(err error) bool {
	return IsSerializationFailure(err) || errors.Is(err, errPartitionRecreated)
}

func isNoPartition(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == codeCheckViolation && pe.ConstraintName == "" // our tables have no CHECK constraints
}

// retryable reports whether an autocommit statement that failed with err
// may simply be run again: the server rolled it back for a transient reason.
func (s *Store) retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch pgCode(err) {
	case codeSerializationFailure, codeDeadlockDetected, codeUniqueViolation:
		// 23505 cannot come from the arbiter index of ON CONFLICT; it can
		// when a concurrent migration or partition swap races the insert.
		return true
	case codeCheckViolation:
		return isNoPartition(err)
	}
	return false
}

// mapErr maps a driver error onto the idem sentinels, keeping the cause:
//   - the server answered with an error: the statement was rolled back,
//     nothing applied -> ErrUnavailable (but a write whose session was
//     ended by a FATAL error -> ErrUnknownOutcome);
//   - the request never left (pool exhausted, connect refused, closed
//     connection detected before sending) -> ErrUnavailable;
//   - anything else during a write (connection lost or context cancelled
//     mid-statement) -> ErrUnknownOutcome: read the record before deciding.
//
// A statement in a transaction (the caller's, or DoTx's before its COMMIT)
// is mapped with write false: whatever became of it, the transaction has
// not committed, and a connection lost under it never will, so nothing is
// applied (ErrUnavailable).
func (s *Store) mapErr(ctx context.Context, err error, write bool) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) || errors.Is(err, idem.ErrInvalidArgument) {
		return err
	}
	if errors.Is(err, errSettle) {
		return fmt.Errorf("%w: pgstore: claim did not settle after %d attempts under contention", idem.ErrUnavailable, maxSettle)
	}
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &pe) && write && (pe.Severity == "FATAL" || pe.Severity == "PANIC"):
		// The session ended instead of answering: a statement whose
		// implicit commit waited for a synchronous standby has committed
		// locally when its session is terminated.
		return fmt.Errorf("%w: pgstore: %w", idem.ErrUnknownOutcome, err)
	case errors.As(err, &pe):
		return fmt.Errorf("%w: pgstore: %w", idem.ErrUnavailable, err)
	case errors.As(err, &ce), pgconn.SafeToRetry(err), !write:
		return fmt.Errorf("%w: pgstore: %w", idem.ErrUnavailable, err)
	}
	_ = ctx
	return fmt.Errorf("%w: pgstore: %w", idem.ErrUnknownOutcome, err)
}
