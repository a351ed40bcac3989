package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
)

// Server and client error numbers ClassifyError recognizes. An error the
// server answered with means the statement did not run, or (a deadlock,
// a lock wait timeout) was rolled back: nothing it did is applied.
var (
	// unavailableErrs: the server refused, aborted or rolled back the
	// statement because of its own state; running it again later is right.
	unavailableErrs = map[uint16]string{
		1040: "too many connections",
		1047: "unknown command (a Galera node not ready)",
		1053: "server shutdown in progress",
		1158: "error reading communication packets",
		1159: "timeout reading communication packets",
		1160: "error writing communication packets",
		1161: "timeout writing communication packets",
		1203: "too many connections for the user",
		1205: "lock wait timeout",
		1213: "deadlock",
		1226: "user resource limit reached",
		1290: "server is read-only (--read-only, a failover)",
		1792: "read-only transaction (a failover)",
		1836: "server is in read-only mode",
		2006: "server has gone away (from a proxy: request not sent)",
		4031: "disconnected by the server for inactivity",
	}
	// unknownErrs: the connection or the commit failed while the
	// statement may have been applied.
	unknownErrs = map[uint16]string{
		1180: "error during COMMIT",
		1927: "connection was killed",
		2013: "lost connection during query (from a proxy)",
		2055: "lost connection (from a proxy)",
	}
)

// ClassifyError implements idem.ErrorClassifier: it maps an error of this
// store's driver (go-sql-driver/mysql through database/sql), for instance
// one a DoTx or ClaimTx handler got from its own statements, onto idem's
// sentinels:
//
//   - wrapped with idem.ErrUnavailable when nothing was applied: the server
//     could not be reached (connection refused, database/sql's
//     driver.ErrBadConn, which it returns only when nothing was sent), or
//     answered that it would not run the statement or rolled it back:
//     too many connections (1040, 1203, 1226), shutdown (1053), read-only
//     during a failover (1290, 1792, 1836), a deadlock (1213) or a lock
//     wait timeout (1205), broken packets (1158-1161), 2006/4031;
//   - wrapped with idem.ErrUnknownOutcome when the connection broke after
//     the statement was sent (mysql.ErrInvalidConn, a packet out of
//     sequence, a reset or timeout), or the server reports a failed COMMIT
//     or a killed connection (1180, 1927; 2013 and 2055 from a proxy);
//   - unchanged otherwise: nil, errors that already match one of the two,
//     context errors, and every other server error (a duplicate key, a
//     syntax error: the handler's, not the infrastructure's).
func (s *Store) ClassifyError(err error) error { return classifyError(err) }

func classifyError(err error) error {
	if err == nil || errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
		return err
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		if what, ok := unavailableErrs[me.Number]; ok {
			return fmt.Errorf("%w: mysqlstore: %s: %w", idem.ErrUnavailable, what, err)
		}
		if what, ok := unknownErrs[me.Number]; ok {
			return fmt.Errorf("%w: mysqlstore: %s: %w", idem.ErrUnknownOutcome, what, err)
		}
		return err
	}
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone):
		// database/sql passes ErrBadConn on only when the driver said that
		// nothing was written; ErrConnDone: the connection was already
		// closed before this call.
		return fmt.Errorf("%w: mysqlstore: %w", idem.ErrUnavailable, err)
	case errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, mysql.ErrPktSync) ||
		errors.Is(err, mysql.ErrPktSyncMul) || errors.Is(err, mysql.ErrMalformPkt):
		return fmt.Errorf("%w: mysqlstore: %w", idem.ErrUnknownOutcome, err)
	}
	return idem.ClassifyError(err) // dial failures, resets, timeouts
}
