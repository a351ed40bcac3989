package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
)

func TestFromURL(t *testing.T) {
	c, err := pgstore.FromURL("postgres://u:secret@db.example:6543/app?sslmode=disable&pool_max_conns=7&application_name=x" +
		"&namespace=orders&schema=idem&table=recs&layout=time_partitioned&period=week&precreate=3&archive=true&keytime=snowflake" +
		"&snowflake_epoch=2021-01-01T00:00:00Z&purge_batch=50&tx_retries=2&maintenance_lock_timeout=3s&commit_idle_timeout=1s&resolve_timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	s := c.Store
	if s.Namespace != "orders" || s.Schema != "idem" || s.Table != "recs" || s.Layout != pgstore.LayoutTimePartitioned ||
		s.Period != 7*24*time.Hour || s.Precreate != 3 || !s.Archive || s.KeyTime == nil || s.PurgeBatch != 50 || s.TxRetries != 2 ||
		s.LockTimeout != 3*time.Second || s.CommitIdleTimeout != time.Second || s.ResolveTimeout != 5*time.Second {
		t.Fatalf("store config %+v", s)
	}
	// The epoch reached the key reader: id 0 is the epoch itself.
	if kt, err := s.KeyTime([]byte("0")); err != nil || !kt.Equal(time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("snowflake epoch: %v %v", kt, err)
	}
	p := c.Pool
	if p.MaxConns != 7 || p.ConnConfig.Host != "db.example" || p.ConnConfig.Port != 6543 || p.ConnConfig.Database != "app" ||
		p.ConnConfig.User != "u" || p.ConnConfig.Password != "secret" || p.ConnConfig.RuntimeParams["application_name"] != "x" {
		t.Fatalf("pool config %+v", p.ConnConfig)
	}
	// None of the store's parameters reaches the server as a setting.
	for k := range p.ConnConfig.RuntimeParams {
		if k != "application_name" {
			t.Errorf("runtime param %q sent to the server", k)
		}
	}
	if c, err := pgstore.FromURL("postgresql:///test?layout=sharded"); err != nil || c.Store.Layout != pgstore.LayoutSharded {
		t.Fatalf("postgresql:// with defaults: %v", err)
	}

	for _, tc := range []struct{ url, err string }{
		{"mysql://x/y", `scheme "mysql"`},
		{"postgres://h/db?layout=hashed", "layout"},
		{"postgres://h/db?layout=sharded&shards=1", "shards"},
		{"postgres://h/db?shards=4", "shards set but layout is single"},
		{"postgres://h/db?layout=time_ordered", "needs KeyTime"},
		{"postgres://h/db?keytime=uuidv8", "keytime"},
		{"postgres://h/db?keytime=ulid&snowflake_epoch=2020-01-01T00:00:00Z", "needs keytime=snowflake"},
		{"postgres://h/db?keytime=snowflake&snowflake_epoch=yesterday", "snowflake_epoch"},
		{"postgres://h/db?period=month", "period"},
		{"postgres://h/db?table=drop%3Btable", "table"},
		{"postgres://h/db?table=a;b", "semicolon"},
		{"postgres://h/db?namespace=a%20b", "namespace"},
		{"postgres://h/db?archive=maybe", "archive"},
		{"postgres://h/db?resolve_timeout=1s", "resolve timeout"},
		{"postgres://h/db?pool_max_conns=many", "pool_max_conns"},
		{"postgres://u:hunter2@h:notaport/db", "bad URL"},
	} {
		_, err := pgstore.FromURL(tc.url)
		if err == nil || !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("FromURL(%q) = %v; want ErrInvalidArgument containing %q", tc.url, err, tc.err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("FromURL(%q): the error shows the password: %v", tc.url, err)
		}
	}
}

// TestFromURLOpenMigrate opens a store from a URL on the test server,
// migrates it and runs a claim; closing the Store closes the pool it made.
func TestFromURLOpenMigrate(t *testing.T) {
	ctx := context.Background()
	schema := testSchema(t, sharedPool(t))
	c, err := pgstore.FromURL(dsn() + "&schema=" + schema + "&namespace=n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cl, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), Lease: time.Second, TTL: time.Minute}); err != nil || cl.Outcome != idem.OutcomeAcquired {
		t.Fatalf("claim: %v %v", cl.Outcome, err)
	}
	s.Close()
	if err := s.Ping(ctx); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
	// An unreachable server: Open is lazy, the first call is ErrUnavailable.
	c, err = pgstore.FromURL("postgres://postgres@127.0.0.1:1/test?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("Migrate on a closed port: %v", err)
	}
}

// TestFromURLEnvironment: what the URL leaves out comes from the libpq
// environment variables, as pgx reads them.
func TestFromURLEnvironment(t *testing.T) {
	t.Setenv("PGHOST", "db.from.env")
	t.Setenv("PGAPPNAME", "from-env")
	c, err := pgstore.FromURL("postgres:///orders?namespace=n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Pool.ConnConfig.Host != "db.from.env" || c.Pool.ConnConfig.RuntimeParams["application_name"] != "from-env" || c.Store.Namespace != "n" {
		t.Fatalf("host %q, params %v", c.Pool.ConnConfig.Host, c.Pool.ConnConfig.RuntimeParams)
	}
}
