package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/idem-dev/idem"
)

// Exit codes of every idem command (docs/cli.md repeats this table).
const (
	exitOK          = 0 // done
	exitError       = 1 // any other failure
	exitUsage       = 2 // bad command, flag, argument or store URL; nothing was done
	exitUnavailable = 3 // the store could not be reached (or timed out); nothing was done
	exitNotFound    = 4 // no live record for the key
	exitConflict    = 5 // the record is not in a state the command applies to (release of a key not in progress)
	exitUnsupported = 6 // the store lacks the capability the command needs (keys, stats, gc, release)
	exitUnknown     = 7 // the store may or may not have applied the change (idem.ErrUnknownOutcome): look again
)

// exitErr carries an exit code with the error it reports.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

// usageError marks err as a usage error (exit 2).
func usageError(format string, a ...any) error {
	return &exitErr{code: exitUsage, err: fmt.Errorf(format, a...)}
}

// errUnsupported is returned when the store lacks a capability.
var errUnsupported = errors.New("not supported by this store")

// exitCode maps an error onto the exit codes above.
func exitCode(err error) int {
	var ee *exitErr
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, idem.ErrUnknownOutcome):
		return exitUnknown
	case errors.Is(err, idem.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return exitUnavailable
	case errors.Is(err, idem.ErrNotFound):
		return exitNotFound
	case errors.Is(err, idem.ErrNotInProgress):
		return exitConflict
	case errors.Is(err, errUnsupported):
		return exitUnsupported
	case errors.Is(err, idem.ErrInvalidKey), errors.Is(err, idem.ErrInvalidArgument):
		return exitUsage
	}
	return exitError
}

// report prints err (if any) on stderr, as {"error": ..., "exit": N} with
// --json, and returns its exit code.
func report(err error, stderr io.Writer, asJSON bool) int {
	code := exitCode(err)
	var ee *exitErr
	if err == nil || errors.As(err, &ee) && ee.err == errSilent {
		return code
	}
	msg := strings.TrimPrefix(err.Error(), "idem: ")
	if asJSON {
		b, _ := json.Marshal(struct {
			Error string `json:"error"`
			Exit  int    `json:"exit"`
		}{msg, code})
		fmt.Fprintf(stderr, "%s\n", b)
		return code
	}
	fmt.Fprintln(stderr, "idem:", msg)
	return code
}

// errSilent is returned by commands that already said why they failed
// (demo prints its own errors).
var errSilent = errors.New("silent")
