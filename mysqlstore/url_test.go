package mysqlstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
	"github.com/idem-dev/idem/mysqlstore/mysqltest"
)

func TestFromURL(t *testing.T) {
	c, err := mysqlstore.FromURL("mysql://app:p%40ss:w@db.example/orders?tls=skip-verify&timeout=3s&collation=utf8mb4_bin&sql_mode=%27ANSI%27" +
		"&namespace=n1&table=recs&version_table=vers&layout=time_partitioned&period=week&precreate=4&retention=240h&archive=1" +
		"&keytime=uuidv7&purge_batch=10&max_batch=20&single_statement=true&tx_retries=3&lock_wait=1s&maintenance_lock_timeout=5s&max_open_conns=9&max_idle_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	d, s := c.Driver, c.Store
	if d.User != "app" || d.Passwd != "p@ss:w" || d.Net != "tcp" || d.Addr != "db.example:3306" || d.DBName != "orders" ||
		d.TLSConfig != "skip-verify" || d.Timeout != 3*time.Second || d.Collation != "utf8mb4_bin" || d.Params["sql_mode"] != "'ANSI'" || len(d.Params) != 1 {
		t.Fatalf("driver config %+v", d)
	}
	if s.Namespace != "n1" || s.Table != "recs" || s.VersionTable != "vers" || s.Layout != mysqlstore.LayoutTimePartitioned ||
		s.Period != 7*24*time.Hour || s.Precreate != 4 || s.Retention != 240*time.Hour || !s.Archive || s.KeyTime == nil ||
		s.PurgeBatch != 10 || s.MaxBatch != 20 || !s.SingleStatement || s.TxRetries != 3 || s.LockWait != time.Second || s.LockTimeout != 5*time.Second ||
		c.MaxOpenConns != 9 || c.MaxIdleConns != 4 {
		t.Fatalf("store config %+v", s)
	}
	for _, tc := range []struct{ url, net, addr, db string }{
		{"mysql://root@127.0.0.1:3307/test", "tcp", "127.0.0.1:3307", "test"},
		{"mysql://root@[::1]/test", "tcp", "[::1]:3306", "test"},
		{"mysql:///test", "tcp", "127.0.0.1:3306", "test"},
		{"mysql://root@/test?socket=/run/mysqld/mysqld.sock", "unix", "/run/mysqld/mysqld.sock", "test"},
	} {
		c, err := mysqlstore.FromURL(tc.url)
		if err != nil || c.Driver.Net != tc.net || c.Driver.Addr != tc.addr || c.Driver.DBName != tc.db {
			t.Errorf("FromURL(%q) = %+v, %v; want %s(%s)/%s", tc.url, c, err, tc.net, tc.addr, tc.db)
		}
	}
	for _, tc := range []struct{ url, err string }{
		{"postgres://h/db", `scheme "postgres"`},
		{"mysql://h/a/b", "has a '/'"},
		{"mysql://h/db?socket=/x.sock", "not both"},
		{"mysql://h/db?tls=maybe", "tls"},
		{"mysql://h/db?timeout=soon", "timeout"},
		{"mysql://h/db?layout=sharded&shards=300", "shards"},
		{"mysql://h/db?layout=time_ordered", "needs KeyTime"},
		{"mysql://h/db?layout=time_partitioned&keytime=ulid&retention=1s", "retention"},
		{"mysql://h/db?maintenance_lock_timeout=10ms", "lock timeout"},
		{"mysql://h/db?table=a-b", "table"},
		{"mysql://h/db?namespace=%00", "namespace"},
		{"mysql://u:hunter2@h:x/db", "bad URL"},
	} {
		_, err := mysqlstore.FromURL(tc.url)
		if err == nil || !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("FromURL(%q) = %v; want ErrInvalidArgument containing %q", tc.url, err, tc.err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("FromURL(%q): the error shows the password: %v", tc.url, err)
		}
	}
}

// TestFromURLOpenMigrate migrates and opens a store from a URL on the
// test server; Open before Migrate says the schema is missing, and closing
// the Store closes the pool it made.
func TestFromURLOpenMigrate(t *testing.T) {
	ctx := context.Background()
	name, _ := mysqltest.NewDB(t)
	c, err := mysqlstore.FromURL("mysql://root@" + mysqltest.Addr() + "/" + name + "?namespace=n1&layout=sharded&shards=4")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Open(ctx); err == nil {
		t.Fatal("Open before Migrate succeeded")
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
	c, err = mysqlstore.FromURL("mysql://root@127.0.0.1:1/test?timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("Migrate on a closed port: %v", err)
	}
}
