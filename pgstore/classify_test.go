package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestClassifyError feeds Store.ClassifyError errors that pgx, pgconn and
// pgxpool really return (made against the server, a closed port, a proxy
// that cuts, a terminated backend) and the SQLSTATEs that cannot be
// provoked on a shared server, and checks the sentinel each maps to.
func TestClassifyError(t *testing.T) {
	base := sharedPool(t)
	var s idem.ErrorClassifier
	s, _ = newStore(t, layouts[0], "classify")
	ctx := ctxT(t)

	// The errors.
	refused := func() error {
		p, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
		if err != nil {
			return err
		}
		defer p.Close()
		_, err = p.Exec(ctx, "SELECT 1")
		return err
	}()
	// pgx's own error for a host name that does not resolve (a
	// ConnectError around the resolver's), and for a lookup that timed
	// out; the resolver is replaced so that the answer does not depend on
	// the machine's DNS.
	lookup := func(dnsErr *net.DNSError) error {
		cfg, err := pgxpool.ParseConfig("postgres://nobody@db.idem-test.invalid:5432/none?connect_timeout=2")
		if err != nil {
			return err
		}
		cfg.ConnConfig.LookupFunc = func(context.Context, string) ([]string, error) { return nil, dnsErr }
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer p.Close()
		_, err = p.Exec(ctx, "SELECT 1")
		return err
	}
	noSuchHost := lookup(&net.DNSError{Err: "no such host", Name: "db.idem-test.invalid", IsNotFound: true})
	lookupTimeout := lookup(&net.DNSError{Err: "i/o timeout", Name: "db.idem-test.invalid", IsTimeout: true})
	closedPool := func() error {
		p, err := pgxpool.New(ctx, dsn())
		if err != nil {
			return err
		}
		p.Close()
		_, err = p.Exec(ctx, "SELECT 1")
		return err
	}()
	terminated := func() error {
		c, err := base.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		pid := c.Conn().PgConn().PID()
		go func() {
			time.Sleep(100 * time.Millisecond)
			_, _ = base.Exec(context.Background(), "SELECT pg_terminate_backend($1)", int32(pid))
		}()
		_, err = c.Exec(ctx, "SELECT pg_sleep(10)")
		return err
	}()
	// The statement's deadline passes once the server is running it. A
	// 100 ms deadline set before acquiring a connection passed, under load,
	// before anything was sent: a bare context error, rightly unchanged. (A
	// cancellation would not do: pgconn reports one in flight as the bare
	// context.Canceled.)
	deadlineInFlight := func() error {
		c, err := base.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		pid := c.Conn().PgConn().PID()
		dctx := newExpiring(ctx)
		defer dctx.expire()
		go func() {
			defer dctx.expire()
			for ctx.Err() == nil && dctx.Err() == nil {
				var active bool
				err := base.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active')", pid).Scan(&active)
				if err != nil || active {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		// The simple protocol: one request, so active means the statement runs.
		_, err = c.Exec(dctx, "SELECT pg_sleep(10)", pgx.QueryExecModeSimpleProtocol)
		return err
	}()
	deadlineBefore := func() error {
		dctx, cancel := context.WithCancel(ctx)
		cancel()
		c, err := base.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		_, err = c.Conn().Exec(dctx, "SELECT 1")
		return err
	}()
	pc := base.Config().ConnConfig
	proxy := newPgProxy(t, net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)))
	answerLost := func() error {
		pp := proxy.pool(t, 1)
		fired := proxy.arm(sqlHas("select 42"), cutAfter, 0)
		_, err := pp.Exec(ctx, "SELECT 42")
		<-fired
		return err
	}()
	var rows pgx.Row = base.QueryRow(ctx, "SELECT 1 WHERE false")
	noRows := rows.Scan()
	unique := func() error {
		_, err := base.Exec(ctx, "CREATE TEMP TABLE u (k int PRIMARY KEY); INSERT INTO u VALUES (1), (1)")
		return err
	}()
	pg := func(code string) error {
		return fmt.Errorf("handler: %w", &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"})
	}

	cases := []struct {
		name string
		err  error
		want error // nil: returned unchanged
	}{
		{"Nil", nil, nil},
		{"ConnectRefused", refused, idem.ErrUnavailable},
		{"PoolClosed", closedPool, idem.ErrUnavailable},
		{"NoSuchHost", noSuchHost, nil}, // a configuration error (idem.IsHostNotFound), not an outage
		{"LookupTimeout", lookupTimeout, idem.ErrUnavailable},
		{"AdminShutdown57P01", terminated, idem.ErrUnknownOutcome},
		{"DeadlineWhileStatementInFlight", deadlineInFlight, idem.ErrUnknownOutcome},
		{"ContextDoneBeforeSending", deadlineBefore, nil},
		{"AnswerLost", answerLost, idem.ErrUnknownOutcome},
		{"CrashShutdown57P02", pg("57P02"), idem.ErrUnknownOutcome},
		{"CannotConnectNow57P03", pg("57P03"), idem.ErrUnavailable},
		{"TooManyConnections53300", pg("53300"), idem.ErrUnavailable},
		{"ConnectionFailure08006", pg("08006"), idem.ErrUnavailable},
		{"IdleInTransactionTimeout25P03", pg("25P03"), idem.ErrUnavailable},
		{"DiskFull53100", pg("53100"), idem.ErrUnavailable},
		{"TransactionResolutionUnknown08007", pg("08007"), idem.ErrUnknownOutcome},
		{"UniqueViolation", unique, nil},
		{"SerializationFailure", pg("40001"), nil},
		{"StatementTimeout57014", pg("57014"), nil},
		{"OutOfMemory53200", pg("53200"), nil},
		{"NoRows", noRows, nil},
		{"HandlerErrorAroundTerminated", &idem.HandlerError{Err: terminated}, idem.ErrUnknownOutcome},
		{"HandlerErrorAroundRefused", &idem.HandlerError{Err: refused}, idem.ErrUnavailable},
		{"AlreadyUnknown", fmt.Errorf("x: %w", idem.ErrUnknownOutcome), nil},
		{"Plain", errors.New("business rule"), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name != "Nil" && tc.err == nil {
				t.Fatal("the scenario produced no error")
			}
			got := s.ClassifyError(tc.err)
			if tc.want == nil {
				if got != tc.err {
					t.Fatalf("ClassifyError(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			}
			if !errors.Is(got, tc.want) || !errors.Is(got, tc.err) {
				t.Fatalf("ClassifyError(%v) = %v, want %v wrapping the original", tc.err, got, tc.want)
			}
			for _, other := range []error{idem.ErrUnavailable, idem.ErrUnknownOutcome} {
				if other != tc.want && errors.Is(got, other) {
					t.Fatalf("ClassifyError(%v) = %v matches %v too", tc.err, got, other)
				}
			}
		})
	}
}

// expiring is a context whose deadline passes when expire is called.
type expiring struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func newExpiring(parent context.Context) *expiring {
	return &expiring{Context: parent, done: make(chan struct{})}
}

func (e *expiring) Done() <-chan struct{} { return e.done }

func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (e *expiring) expire() { e.once.Do(func() { close(e.done) }) }
