package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
)

// MariaDB/MySQL error numbers the store acts on.
const (
	erDupEntry         = 1062 // duplicate key
	erLockWaitTimeout  = 1205 // innodb_lock_wait_timeout: another transaction holds the row
	erLockDeadlock     = 1213 // deadlock: the whole transaction was rolled back
	erNoSuchTable      = 1146
	erSavepointMissing = 1305 // SAVEPOINT ... does not exist: the transaction that set it ended
)

func isServerErr(err error, num uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == num
}

// IsRetryable reports whether err means the transaction was rolled back, by
// a deadlock (1213) or otherwise before it could commit (ErrTxEnded), and
// may simply be run again, from its start. DoTx retries these itself;
// callers managing their own transaction around ClaimTx use it.
func IsRetryable(err error) bool {
	return isServerErr(err, erLockDeadlock) || errors.Is(err, ErrTxEnded)
}

// mapErr maps a driver error onto the store's sentinels. write says whether
// the failed call could have changed data: a connection lost after a write
// was sent is ErrUnknownOutcome, while an error answered by the server (the
// statement, run in autocommit, was rolled back) or a failure to connect is
// ErrUnavailable.
func mapErr(err error, write bool) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
		return err
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return fmt.Errorf("%w: mysqlstore: %w", idem.ErrUnavailable, err)
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		// database/sql only surfaces ErrBadConn before anything was sent.
		return fmt.Errorf("%w: mysqlstore: %w", idem.ErrUnavailable, err)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("%w: mysqlstore: %w", idem.ErrUnavailable, err)
	}
	if !write {
		return fmt.Errorf("%w: mysqlstore: %w", idem.ErrUnavailable, err)
	}
	// Context cancelled mid-statement, mysql.ErrInvalidConn, EOF, reset:
	// the statement may have committed.
	return fmt.Errorf("%w: mysqlstore: %w", idem.ErrUnknownOutcome, err)
}

// conn takes a connection from the pool for the statements of one call.
// Nothing of the call is sent while taking it: database/sql first checks a
// pooled connection's liveness (the driver's ResetSession; a dead one is
// dropped and the next one tried, then a new one dialed), and a new
// connection is dialed and authenticated. So a failure here is
// idem.ErrUnavailable whatever the driver said, notably
// mysql.ErrInvalidConn when a proxy in front of a stopped server (HAProxy,
// ProxySQL, toxiproxy) accepts the TCP connection and closes it: the
// handshake's read fails with the error a connection lost after a
// statement was sent also gives, which mapErr must take as
// idem.ErrUnknownOutcome for a write. Taking the connection apart from the
// statement is what tells the two apart.
func (s *Store) conn(ctx context.Context) (*sql.Conn, error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqlstore: no connection: %w", idem.ErrUnavailable, err)
	}
	return c, nil
}

// ctxErr reports a context already done, before any I/O.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return nil
}
