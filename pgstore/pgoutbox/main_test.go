package pgoutbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outboxtest"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	closePool()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// dsn is the test server: PGSTORE_DSN or the local PostgreSQL.
func dsn() string {
	if d := os.Getenv("PGSTORE_DSN"); d != "" {
		return d
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

var (
	poolMu sync.Mutex
	pool   *pgxpool.Pool
)

func newPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// sharedPool is one pool for the test binary, closed in TestMain. It fails
// the test when PostgreSQL is unreachable.
func sharedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	poolMu.Lock()
	defer poolMu.Unlock()
	if pool == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := newPool(ctx, 40)
		if err != nil {
			t.Fatalf("postgres at %s unreachable: %v", dsn(), err)
		}
		pool = p
	}
	return pool
}

func closePool() {
	poolMu.Lock()
	defer poolMu.Unlock()
	if pool != nil {
		pool.Close()
		pool = nil
	}
}

// testSchema creates a uniquely named schema dropped when t ends.
func testSchema(t testing.TB, p *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "pgoutbox_t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newOutbox migrates a fresh table in a fresh schema.
func newOutbox(t testing.TB, mod func(c *pgoutbox.Config)) (*pgoutbox.Outbox, pgoutbox.Config) {
	t.Helper()
	p := sharedPool(t)
	cfg := pgoutbox.Config{Pool: p, Schema: testSchema(t, p), Table: "outbox", NewID: outboxtest.NewID(), Ordered: true, Logger: outboxtest.Quiet()}
	if mod != nil {
		mod(&cfg)
	}
	if err := pgoutbox.Migrate(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	ob, err := pgoutbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	if err := ob.CheckSchema(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return ob, cfg
}

type pgTx struct {
	ob *pgoutbox.Outbox
	tx pgx.Tx
}

func (t pgTx) Enqueue(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
	return t.ob.Enqueue(ctx, t.tx, msgs...)
}
func (t pgTx) Commit(ctx context.Context) error {
	if err := t.tx.Commit(ctx); err != nil {
		return err
	}
	t.ob.Notify() // a no-op unless NotifyAfterCommit
	return nil
}
func (t pgTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

func harness(t testing.TB, mod func(c *pgoutbox.Config)) outboxtest.Harness {
	ob, cfg := newOutbox(t, mod)
	return outboxtest.Harness{
		Backend: ob,
		Begin: func(ctx context.Context) (outboxtest.Tx, error) {
			tx, err := cfg.Pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			return pgTx{ob, tx}, nil
		},
		Crash: pgoutbox.CrashBatch,
		BreakHeaders: func(t testing.TB, id string) {
			t.Helper()
			if _, err := cfg.Pool.Exec(ctxT(t), "UPDATE "+pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()+` SET headers = '\xff'::bytea WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
		},
	}
}
