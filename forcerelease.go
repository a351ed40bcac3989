package idem

import (
	"context"
	"errors"
)

// ErrNotInProgress: ForceRelease found the record in another state than
// StateInProgress (completed, failed or released). Nothing was changed.
var ErrNotInProgress = errors.New("idem: record not in progress")

// ForceReleaser is an optional Store capability for operators: release a
// key stuck in progress (its worker is gone and its lease, long or
// renewed by a heartbeat that should have stopped, keeps redeliveries out)
// without knowing its token.
//
// ForceRelease moves the live record of key from StateInProgress, whatever
// its token and whether or not its lease has lapsed, to StateReleased with
// LastError = cause (when not empty), keeping its token, attempts and
// fingerprint, in one atomic operation. The holder is fenced at once: its
// Complete, Fail and Extend find the record no longer in progress and get
// ErrFenced (its Release still returns nil, as for any repeated release),
// and the next claim acquires the key with a larger token. It returns
// ErrNotFound when there is no live record and ErrNotInProgress (changing
// nothing) when the record is completed, failed or released. cause is
// checked like Release's (ValidateCause).
//
// Force-releasing a key whose holder is still running lets the effect run
// twice: the holder's effect is not undone, only its record is fenced. It
// is for workers known to be dead.
type ForceReleaser interface {
	ForceRelease(ctx context.Context, key []byte, cause string) error
}
