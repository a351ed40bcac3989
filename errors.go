package idem

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Stores and adapters return these (wrapped with %w) so that
// callers can branch with errors.Is whatever the backend is.
var (
	// ErrInvalidKey: the key is empty or longer than MaxKeyLen. Returned
	// before any I/O; nothing is stored.
	ErrInvalidKey = errors.New("idem: invalid key")
	// ErrInvalidArgument: a lease, TTL, token, fingerprint, result, cause or
	// namespace is out of range. Returned before any I/O; nothing is stored.
	ErrInvalidArgument = errors.New("idem: invalid argument")
	// ErrNotFound: no live record for the key (never claimed, deleted, or
	// past its retention).
	ErrNotFound = errors.New("idem: record not found")
	// ErrFenced: the token presented is not the record's current token, or
	// the record is no longer in a state that token may change. Nothing was
	// changed.
	ErrFenced = errors.New("idem: fenced: stale token")
	// ErrInProgress: another worker holds a live lease on the key. Do not
	// ack the message as done; retry after the lease ends.
	ErrInProgress = errors.New("idem: in progress")
	// ErrFailed: the key was marked failed for good (attempts exhausted or a
	// permanent error); dead-letter instead of retrying.
	ErrFailed = errors.New("idem: failed permanently")
	// ErrFingerprintMismatch: the key was first claimed with another payload
	// fingerprint. Never replay another message's result.
	ErrFingerprintMismatch = errors.New("idem: fingerprint mismatch")
	// ErrUnavailable: the store could not be reached; the operation was not
	// applied. The guard fails closed on it unless fail-open is set.
	ErrUnavailable = errors.New("idem: store unavailable")
	// ErrUnknownOutcome: the request may or may not have been applied (a
	// timeout or a connection lost mid-commit). Read the record before
	// deciding; never ack on it.
	ErrUnknownOutcome = errors.New("idem: unknown outcome")
	// ErrCapacity: a bounded store is full of live records. It refuses new
	// keys rather than evict records that still guard against duplicates.
	ErrCapacity = errors.New("idem: store at capacity")
	// ErrCorrupt: the stored record of a key cannot be decoded (damaged
	// bytes, a value of the wrong type, an unknown format). It concerns that
	// key alone: the operation changed nothing, other keys are served, and in
	// a batch it is that entry's error. It is not ErrUnavailable (the store
	// answered): fail-open must not let a message through on it, and retrying
	// does not help; the record needs an operator.
	ErrCorrupt = errors.New("idem: corrupt record")
	// ErrClosed: the store or guard was closed.
	ErrClosed = errors.New("idem: closed")
	// ErrUnrecorded: the handler's effect happened but its completion could
	// not be recorded within the claim's lease. Ack the message (the effect
	// is done). The guard keeps completing it in the background with the
	// lease kept alive (WithBackgroundRetry, Hooks.OnUnrecorded); a
	// redelivery that takes the key over before that succeeds (after the
	// lease lapsed in a full outage) runs it again: see docs/guard.md.
	ErrUnrecorded = errors.New("idem: effect done but completion not recorded")
	// ErrResultTooLarge: the handler's effect ran but its result is longer
	// than MaxResultLen, so it cannot be recorded. The guard marks the key
	// failed (terminal, the record's LastError says why) instead of
	// releasing it, so the effect never runs again; duplicates get
	// ErrFailed. The effect is done: ack the message (or dead-letter it for
	// a person to look at), do not retry it. Keep results small (an id, a
	// status) and the bulk in the effect's own store.
	ErrResultTooLarge = errors.New("idem: result too large to record")
	// ErrLeaseLost: the heartbeat found the claim taken over or gone; the
	// handler's context is cancelled with this cause.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrPanicked: the handler panicked. Do recovers the panic, logs its
	// stack, releases the key (the panic counts as a failed attempt) and
	// returns a *HandlerError matching this.
	ErrPanicked = errors.New("idem: handler panicked")
)

// InProgressError is returned by the guard when another worker holds the
// key. It matches ErrInProgress.
type InProgressError struct {
	Key        []byte
	LeaseUntil time.Time // on the store's clock
	// Lease is the lease the refused claim asked for, which bounds
	// RetryAfter (0: unknown, MaxLease bounds it).
	Lease time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idem: key %q in progress until %s", truncKey(e.Key), e.LeaseUntil.Format(time.RFC3339Nano))
}

// Is reports a match with ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// RetryAfter is how long until the holder's lease ends, measured from now
// on the local clock, at least one millisecond and at most Lease (or
// MaxLease when Lease is unknown). LeaseUntil is on the store's clock: a
// store clock ahead of the local one would otherwise give a wait of the
// skew (hours), one behind it a negative one; a lease is never longer
// than the claim asked for, so after Lease at most the key is worth asking
// for again.
func (e *InProgressError) RetryAfter(now time.Time) time.Duration {
	return clampRetryAfter(e.LeaseUntil.Sub(now), e.Lease)
}

// InProgressOf is the InProgressError for an in-progress record read from
// a store (a transactional claim, a service's answer): its lease end, with
// the record's own lease span (UpdatedAt to LeaseUntil, both on the
// store's clock) bounding RetryAfter, MaxLease when the record does not say.
func InProgressOf(rec *Record) *InProgressError {
	e := &InProgressError{Key: rec.Key, LeaseUntil: rec.LeaseUntil}
	if !rec.UpdatedAt.IsZero() && rec.LeaseUntil.After(rec.UpdatedAt) {
		e.Lease = rec.LeaseUntil.Sub(rec.UpdatedAt)
	}
	return e
}

// clampRetryAfter bounds d to [1ms, lease] (lease <= 0: MaxLease).
func clampRetryAfter(d, lease time.Duration) time.Duration {
	if lease <= 0 || lease > MaxLease {
		lease = MaxLease
	}
	return max(time.Millisecond, min(d, lease))
}

// FailedError is returned when the key is in the terminal failed state. It
// matches ErrFailed.
type FailedError struct {
	Key      []byte
	Cause    string
	Attempts int
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("idem: key %q failed after %d attempt(s): %s", truncKey(e.Key), e.Attempts, e.Cause)
}

// Is reports a match with ErrFailed.
func (e *FailedError) Is(target error) bool { return target == ErrFailed }

// ResultTooLargeError is returned when a handler's effect ran but its
// result (Len bytes) is longer than MaxResultLen. The guard marks the key
// failed with the reason rather than releasing it, so the effect is not
// run again. It matches ErrResultTooLarge.
type ResultTooLargeError struct {
	Key []byte
	Len int
}

func (e *ResultTooLargeError) Error() string {
	return fmt.Sprintf("idem: key %q: effect done but its result of %d bytes exceeds MaxResultLen %d; key marked failed",
		truncKey(e.Key), e.Len, MaxResultLen)
}

// Is reports a match with ErrResultTooLarge.
func (e *ResultTooLargeError) Is(target error) bool { return target == ErrResultTooLarge }

// HandlerError wraps an error returned (or a panic raised) by the user's
// handler, so callers can tell a handler failure from a store failure.
type HandlerError struct{ Err error }

func (e *HandlerError) Error() string { return "idem: handler: " + e.Err.Error() }
func (e *HandlerError) Unwrap() error { return e.Err }

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks a handler error as not worth retrying: the guard marks the
// key failed at once instead of releasing it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

func truncKey(k []byte) []byte {
	if len(k) > 64 {
		return k[:64]
	}
	return k
}
