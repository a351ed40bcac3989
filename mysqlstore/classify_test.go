package mysqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

func TestClassifyError(t *testing.T) {
	const (
		same = iota
		unavailable
		unknown
	)
	server := func(n uint16) error { return &mysql.MySQLError{Number: n, Message: "m"} }
	already := fmt.Errorf("%w: x", idem.ErrUnavailable)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, same},
		{"too many connections 1040", server(1040), unavailable},
		{"shutdown 1053", server(1053), unavailable},
		{"lock wait timeout 1205", server(1205), unavailable},
		{"deadlock 1213", server(1213), unavailable},
		{"deadlock wrapped by a handler", &idem.HandlerError{Err: fmt.Errorf("charge: %w", server(1213))}, unavailable},
		{"read-only 1290", server(1290), unavailable},
		{"read-only mode 1836", server(1836), unavailable},
		{"gone away 2006", server(2006), unavailable},
		{"inactivity 4031", server(4031), unavailable},
		{"error during commit 1180", server(1180), unknown},
		{"connection killed 1927", server(1927), unknown},
		{"lost connection 2013", server(2013), unknown},
		{"duplicate key 1062: the handler's", server(1062), same},
		{"syntax 1064: the handler's", server(1064), same},
		{"statement timeout 1969: the handler's", server(1969), same},
		{"driver.ErrBadConn: nothing sent", driver.ErrBadConn, unavailable},
		{"sql.ErrConnDone", sql.ErrConnDone, unavailable},
		{"mysql.ErrInvalidConn: sent, no reply", mysql.ErrInvalidConn, unknown},
		{"mysql.ErrPktSync", mysql.ErrPktSync, unknown},
		{"mysql.ErrMalformPkt", mysql.ErrMalformPkt, unknown},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, unavailable},
		{"no such host: configuration", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "db.invalid", IsNotFound: true}}, same},
		{"name lookup timeout", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "db", IsTimeout: true}}, unavailable},
		{"reset mid-read", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, unknown},
		{"broken pipe mid-write", &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, unknown},
		{"unexpected EOF", io.ErrUnexpectedEOF, unknown},
		{"context cancelled", context.Canceled, same},
		{"deadline", context.DeadlineExceeded, same},
		{"already unavailable", already, same},
		{"already unknown", fmt.Errorf("%w: y", idem.ErrUnknownOutcome), same},
		{"ErrTxEnded", fmt.Errorf("%w: %w", idem.ErrUnavailable, mysqlstore.ErrTxEnded), same},
		{"sql.ErrTxDone: a bug, not the infrastructure", sql.ErrTxDone, same},
		{"plain", boom, same},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := (*mysqlstore.Store)(nil).ClassifyError(tc.err)
			isU, isK := errors.Is(got, idem.ErrUnavailable), errors.Is(got, idem.ErrUnknownOutcome)
			switch tc.want {
			case same:
				if got != tc.err {
					t.Fatalf("ClassifyError(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			case unavailable:
				if !isU || isK {
					t.Fatalf("ClassifyError(%v) = %v, want ErrUnavailable only", tc.err, got)
				}
			case unknown:
				if !isK || isU {
					t.Fatalf("ClassifyError(%v) = %v, want ErrUnknownOutcome only", tc.err, got)
				}
			}
			if !errors.Is(got, tc.err) {
				t.Fatalf("ClassifyError(%v) = %v lost the original error", tc.err, got)
			}
		})
	}
}

// The same on errors the driver really returns.
func TestClassifyErrorLive(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	ctx := testCtx(t)
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		dead, err := sql.Open("mysql", dsn(addr, "test"))
		if err != nil {
			t.Fatal(err)
		}
		defer dead.Close()
		err = dead.PingContext(ctx)
		if got := s.ClassifyError(err); !errors.Is(got, idem.ErrUnavailable) || errors.Is(got, idem.ErrUnknownOutcome) {
			t.Fatalf("refused: %v -> %v, want ErrUnavailable", err, got)
		}
	})
	t.Run("deadlock", func(t *testing.T) {
		rig := newDeadlockRig(t, db)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		err = rig.provoke(ctx, tx)
		if !mysqlstore.IsRetryable(err) {
			t.Fatalf("no deadlock: %v", err)
		}
		if got := s.ClassifyError(err); !errors.Is(got, idem.ErrUnavailable) {
			t.Fatalf("deadlock: %v -> %v, want ErrUnavailable", err, got)
		}
	})
	t.Run("duplicate key", func(t *testing.T) {
		if _, err := db.ExecContext(ctx, "CREATE TABLE u (id INT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		_, err := db.ExecContext(ctx, "INSERT INTO u VALUES (1), (1)")
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1062 {
			t.Fatalf("want 1062, got %v", err)
		}
		if got := s.ClassifyError(err); got != err {
			t.Fatalf("duplicate key: %v -> %v, want unchanged", err, got)
		}
	})
}
