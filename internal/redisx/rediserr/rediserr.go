// Package rediserr maps go-redis errors onto idem's sentinel errors, for
// the store and the lock alike.
package rediserr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

// class is what an error says about a command's fate.
type class int

const (
	other    class = iota // not an infrastructure error (a reply such as WRONGTYPE, redis.Nil)
	notSent               // never reached the server: dial failure, pool timeout
	refused               // the server refused it before running it (LOADING, READONLY...)
	capacity              // the server refused it for memory (OOM)
	closed                // the client was closed
	lost                  // sent, and its answer lost (EOF, reset, timeout): it may have run
	ctxDone               // the caller's context ended
)

// refusals are the reply codes (first word) of a server that did not run
// the command: it is loading, not a master, not serving the slot, cannot
// persist, too busy with a script, or the client may not run it.
var refusals = map[string]bool{
	"LOADING": true, "BUSY": true, "TRYAGAIN": true, "CLUSTERDOWN": true, "MASTERDOWN": true,
	"READONLY": true, "MOVED": true, "ASK": true, "NOREPLICAS": true, "MISCONF": true,
	"NOAUTH": true, "WRONGPASS": true, "NOPERM": true,
}

func classify(err error) class {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		code, _, _ := strings.Cut(msg, " ")
		switch {
		case code == "OOM":
			return capacity
		case refusals[code]:
			return refused
		case strings.HasPrefix(msg, "ERR max number of clients reached"):
			return refused
		}
		return other
	}
	switch {
	case errors.Is(err, redis.ErrClosed):
		return closed
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted), isDialError(err):
		return notSent
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, net.ErrClosed):
		return lost
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ctxDone // checked before net.Error, which DeadlineExceeded implements
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		return lost // a read or write on a connection failed or timed out
	}
	return other
}

// Map maps go-redis errors onto idem's. write says whether the command
// may have changed data, which decides between ErrUnavailable (surely not
// applied) and ErrUnknownOutcome (maybe applied). Any other error the
// store's own call got (the store knows it talked to Redis) is taken as
// lost: unknown for a write.
func Map(ctx context.Context, err error, op string, write bool) error {
	if err == nil {
		return nil
	}
	unknown := idem.ErrUnavailable
	if write {
		unknown = idem.ErrUnknownOutcome
	}
	switch c := classify(err); {
	case c == capacity:
		return fmt.Errorf("%w: %w: %s: %w", idem.ErrUnavailable, idem.ErrCapacity, op, err)
	case c == refused, c == notSent:
		return fmt.Errorf("%w: %s: %w", idem.ErrUnavailable, op, err)
	case c == closed:
		return fmt.Errorf("%w: %w: %s: %w", idem.ErrUnavailable, idem.ErrClosed, op, err)
	case c == other && isReply(err):
		return fmt.Errorf("%s: %w", op, err) // the server ran it and answered with an error
	}
	// EOF, connection reset, read timeout, context ended: the command may
	// have run.
	return fmt.Errorf("%w: %s: %w", unknown, op, err)
}

// Classify is idem.ErrorClassifier for go-redis errors whose command the
// caller cannot name (a handler's own Redis calls). It knows go-redis's own
// errors: wrapped with idem.ErrUnavailable when the command surely did not
// run (a pool timeout; a server reply LOADING, READONLY, CLUSTERDOWN,
// TRYAGAIN, MASTERDOWN, MOVED/ASK, MISCONF, NOREPLICAS, BUSY, auth, max
// clients; OOM also with idem.ErrCapacity; a closed client also with
// idem.ErrClosed); any other reply (WRONGTYPE, a script's error, redis.Nil)
// unchanged. The rest goes to idem.ClassifyError: a failed dial is
// unavailable, a connection reset, broken pipe, i/o timeout or unexpected
// EOF after the request was written is unknown, a context error or a bare
// io.EOF is unchanged (go-redis reports a connection the server closed as
// a bare io.EOF, but so does any reader at its end: not classified). A
// host name that does not exist (idem.IsHostNotFound) is unchanged too: a
// configuration error, not an outage.
func Classify(err error) error {
	if err == nil || errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) || idem.IsHostNotFound(err) {
		return err
	}
	switch classify(err) {
	case capacity:
		return fmt.Errorf("%w: %w: %w", idem.ErrUnavailable, idem.ErrCapacity, err)
	case refused, notSent:
		return fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
	case closed:
		return fmt.Errorf("%w: %w: %w", idem.ErrUnavailable, idem.ErrClosed, err)
	case other:
		if isReply(err) {
			return err
		}
	}
	return idem.ClassifyError(err)
}

func isReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// isDialError reports a failure to connect: the command was never sent.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
