package pgstore

import (
	"errors"
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

var _ idem.ErrorClassifier = (*Store)(nil)

// unavailableCodes are the SQLSTATEs that say the server could not serve
// the session (nothing of the failed statement, or of its transaction, is
// applied): the database is down, restarting, full or unreachable, not
// the statement at fault.
var unavailableCodes = map[string]string{
	"08000": "connection exception",
	"08001": "unable to establish connection",
	"08003": "connection does not exist",
	"08004": "server rejected the connection",
	"08006": "connection failure",
	"08P01": "protocol violation",
	"25P03": "idle-in-transaction session timeout",
	"53100": "disk full",
	"53300": "too many connections",
	"57P03": "cannot connect now (starting up or shutting down)",
	"57P05": "idle session timeout",
	"58030": "I/O error",
}

// unknownCodes: the work may have committed. The server says so itself
// (08007, 40003), or it ended the session while a request may have been in
// progress: a COMMIT waiting for a synchronous standby that is terminated
// has committed locally, and the client gets 57P01 instead of its answer.
var unknownCodes = map[string]string{
	"08007": "transaction resolution unknown",
	"40003": "statement completion unknown",
	"57P01": "session terminated (admin shutdown)",
	"57P02": "session terminated (crash shutdown)",
}

// ClassifyError implements idem.ErrorClassifier for errors from pgx,
// pgconn and pgxpool, such as a DoTx handler's or a ClaimTx caller's own
// statements return:
//
//   - nil stays nil; errors already matching idem.ErrUnavailable or
//     idem.ErrUnknownOutcome (every error pgstore's own methods return for
//     an infrastructure fault) are returned unchanged;
//   - the server answered with one of the SQLSTATEs above that say it could
//     not serve (class 08 connection exceptions, 57P03 starting up or
//     shutting down, 57P05 and 25P03 session timeouts of an idle session,
//     53300 too many connections, 53100 disk full, 58030 I/O error):
//     ErrUnavailable; 08007 and 40003 (the server cannot tell), 57P01 and
//     57P02 (the session was terminated, perhaps during a COMMIT that a
//     synchronous standby held: committed locally): ErrUnknownOutcome;
//   - a host name that does not exist (idem.IsHostNotFound, inside a
//     ConnectError too) is returned unchanged: a configuration error, not
//     an outage;
//   - pgconn could not connect (ConnectError: refused, unreachable, TLS,
//     authentication, a name lookup that timed out), the pool is closed, or pgconn says nothing was
//     written (pgconn.SafeToRetry): ErrUnavailable;
//   - a deadline or cancellation that interrupted a statement in flight
//     (pgconn.Timeout and not SafeToRetry), or a connection closed after
//     the request was written: ErrUnknownOutcome;
//   - everything else goes to idem.ClassifyError (broken connections:
//     ErrUnknownOutcome; a bare context error: unchanged), and any other
//     SQLSTATE is returned unchanged: a constraint violation, a
//     serialization failure that outlived DoTx's retries, a statement
//     timeout (57014) or an out-of-memory error say something about the
//     work, and must spend an attempt like any handler failure.
//
// The original error stays in the chain.
func (s *Store) ClassifyError(err error) error { return classifyError(err) }

func classifyError(err error) error {
	if err == nil || errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) || idem.IsHostNotFound(err) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if what, ok := unavailableCodes[pe.Code]; ok {
			return fmt.Errorf("%w: pgstore: %s: %w", idem.ErrUnavailable, what, err)
		}
		if what, ok := unknownCodes[pe.Code]; ok {
			return fmt.Errorf("%w: pgstore: %s: %w", idem.ErrUnknownOutcome, what, err)
		}
		return err
	}
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ce), errors.Is(err, puddle.ErrClosedPool):
		return fmt.Errorf("%w: pgstore: %w", idem.ErrUnavailable, err)
	case pgconn.SafeToRetry(err):
		if pgconn.Timeout(err) {
			return err // the caller's context was done before anything was sent
		}
		return fmt.Errorf("%w: pgstore: nothing sent: %w", idem.ErrUnavailable, err)
	case pgconn.Timeout(err):
		return fmt.Errorf("%w: pgstore: interrupted while a statement was in flight: %w", idem.ErrUnknownOutcome, err)
	case errors.Is(err, pgconn.ErrConnClosed):
		return fmt.Errorf("%w: pgstore: %w", idem.ErrUnknownOutcome, err)
	}
	return idem.ClassifyError(err)
}
