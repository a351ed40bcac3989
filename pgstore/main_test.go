package pgstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/fnv"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	closePools()
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

// sharedPool is one pool for the whole test binary, closed in TestMain.
func sharedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	poolMu.Lock()
	defer poolMu.Unlock()
	if pool == nil {
		cfg, err := pgxpool.ParseConfig(dsn())
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 24
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("postgres at %s: %v", dsn(), err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Ping(ctx); err != nil {
			p.Close()
			t.Fatalf("postgres at %s unreachable: %v", dsn(), err)
		}
		pool = p
	}
	return pool
}

func closePools() {
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
	name := "pgstore_t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// testKeyTime spreads arbitrary test keys over three days around now (a
// pure function of the key), so timed layouts run the whole suite with
// several partitions, one of them in the past.
var testBase = time.Now().UTC().Truncate(24 * time.Hour)

// A key "old-<n>-..." lands n days before today instead: a period of its
// own, long over, where maintenance drops partitions.
func testKeyTime(key []byte) (time.Time, error) {
	h := fnv.New64a()
	h.Write(key)
	if rest, ok := bytes.CutPrefix(key, []byte("old-")); ok {
		if d, _, ok := bytes.Cut(rest, []byte("-")); ok {
			if n, err := strconv.Atoi(string(d)); err == nil && n > 0 && n < 1000 {
				off := time.Duration(h.Sum64()%(24*3600*1000)) * time.Millisecond
				return testBase.AddDate(0, 0, -n).Add(off), nil
			}
		}
	}
	off := time.Duration(h.Sum64()%(3*24*3600*1000)) * time.Millisecond
	return testBase.Add(-24*time.Hour + off), nil
}

type layoutCase struct {
	name string
	cfg  func(c *pgstore.Config)
}

func (lc layoutCase) config() pgstore.Config {
	var c pgstore.Config
	lc.cfg(&c)
	return c
}

func (lc layoutCase) timed() bool {
	l := lc.config().Layout
	return l == pgstore.LayoutTimeOrdered || l == pgstore.LayoutTimePartitioned
}

func (lc layoutCase) partitioned() bool { return lc.config().Layout == pgstore.LayoutTimePartitioned }

var layouts = []layoutCase{
	{"single", func(c *pgstore.Config) {}},
	{"sharded", func(c *pgstore.Config) { c.Layout = pgstore.LayoutSharded; c.Shards = 4 }},
	{"time_ordered", func(c *pgstore.Config) { c.Layout = pgstore.LayoutTimeOrdered; c.KeyTime = testKeyTime }},
	{"time_partitioned", func(c *pgstore.Config) {
		c.Layout = pgstore.LayoutTimePartitioned
		c.KeyTime = testKeyTime
		c.Archive = true
	}},
}

// newStore migrates a fresh schema for the layout and returns a store on it.
func newStore(t testing.TB, lc layoutCase, ns string) (*pgstore.Store, pgstore.Config) {
	t.Helper()
	p := sharedPool(t)
	cfg := pgstore.Config{Pool: p, Schema: testSchema(t, p), Table: "rec", Namespace: ns}
	lc.cfg(&cfg)
	return openStore(t, cfg)
}

func openStore(t testing.TB, cfg pgstore.Config) (*pgstore.Store, pgstore.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pgstore.Migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, cfg
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
