package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
)

// ClassifyError maps an infrastructure error onto idem's sentinels without
// knowing the driver that produced it:
//
//   - nil stays nil; an error already matching ErrUnavailable or
//     ErrUnknownOutcome is returned unchanged;
//   - a name that does not exist (IsHostNotFound: "no such host") is
//     returned unchanged: it is a configuration error, which no wait
//     fixes, so it must spend attempts like any handler failure;
//   - the connection could not be made, so no request was sent (a failed
//     dial of any other cause, a name lookup that timed out or whose
//     server failed, ECONNREFUSED, EHOSTUNREACH, ENETUNREACH): wrapped
//     with ErrUnavailable;
//   - the connection broke or timed out after a request may have been sent
//     (ECONNRESET, ECONNABORTED, EPIPE, ETIMEDOUT, an I/O timeout on an
//     established connection, io.ErrUnexpectedEOF, net.ErrClosed): wrapped
//     with ErrUnknownOutcome;
//   - anything else is returned unchanged: context.Canceled and
//     context.DeadlineExceeded (the caller's own decision), a bare io.EOF
//     (also what a parser says at the end of its input), SQL and
//     application errors.
//
// The original error stays in the chain (errors.Is and errors.As still find
// it). Stores know their driver's own error types: prefer a store's
// ErrorClassifier, which falls back on this function; the consumer runtime
// applies it to handler errors so that an unreachable database or broker
// never counts as a failed attempt of the message.
func ClassifyError(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrUnknownOutcome) || IsHostNotFound(err) {
		return err
	}
	if notSent(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if maybeSent(err) {
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	return err
}

// IsHostNotFound reports a name lookup that found no such host
// (net.DNSError with IsNotFound): the name is wrong or not registered, a
// configuration error rather than an outage. ClassifyError leaves such an
// error unchanged (a DNS timeout or a failing name server is
// ErrUnavailable), and so do the stores' classifiers, which check it before
// their driver's connect errors that wrap it.
func IsHostNotFound(err error) bool {
	var dns *net.DNSError
	return errors.As(err, &dns) && dns.IsNotFound
}

// notSent reports an error that says no connection was made.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// maybeSent reports an error of a connection that broke or timed out while
// in use.
func maybeSent(err error) bool {
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	// context.DeadlineExceeded is a net.Error with Timeout() too, but it is
	// the caller's own deadline, not a broken connection.
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, context.DeadlineExceeded)
}
