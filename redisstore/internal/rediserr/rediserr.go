// Package rediserr maps go-redis errors onto idem's sentinel errors, for
// the store and the lock alike.
package rediserr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

// Map maps go-redis errors onto idem's. write says whether the command
// may have changed data, which decides between ErrUnavailable (surely not
// applied) and ErrUnknownOutcome (maybe applied).
func Map(ctx context.Context, err error, op string, write bool) error {
	if err == nil {
		return nil
	}
	unknown := idem.ErrUnavailable
	if write {
		unknown = idem.ErrUnknownOutcome
	}
	var rerr redis.Error
	switch {
	case errors.As(err, &rerr):
		msg := strings.TrimPrefix(rerr.Error(), "ERR ")
		switch {
		case strings.HasPrefix(msg, "OOM"):
			return fmt.Errorf("%w: %w: %s: %w", idem.ErrUnavailable, idem.ErrCapacity, op, err)
		case hasAnyPrefix(msg, "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "MOVED", "ASK", "NOREPLICAS", "MISCONF", "NOAUTH", "WRONGPASS", "NOPERM"):
			// The server refused the command before running it.
			return fmt.Errorf("%w: %s: %w", idem.ErrUnavailable, op, err)
		}
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, redis.ErrClosed):
		return fmt.Errorf("%w: %w: %s: %w", idem.ErrUnavailable, idem.ErrClosed, op, err)
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted), isDialError(err):
		// Nothing was sent.
		return fmt.Errorf("%w: %s: %w", idem.ErrUnavailable, op, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
		return fmt.Errorf("%w: %s: %w", unknown, op, err)
	}
	// EOF, connection reset, read timeout: the command may have run.
	return fmt.Errorf("%w: %s: %w", unknown, op, err)
}

func hasAnyPrefix(s string, ps ...string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// isDialError reports a failure to connect: the command was never sent.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
