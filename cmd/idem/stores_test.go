package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
	"github.com/idem-dev/idem/pgstore"
	"github.com/idem-dev/idem/redisstore"
)

func unique(prefix string) string {
	var b [6]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// pgURL makes a schema on the test PostgreSQL, dropped after the test.
func pgURL(t *testing.T) string {
	ctx := context.Background()
	base := "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	schema := unique("cli_")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		pool.Close()
		t.Fatalf("postgres unreachable: %v", err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	})
	return base + "&schema=" + schema + "&layout=time_partitioned&keytime=snowflake&archive=true"
}

// mysqlURL makes a database on the test MariaDB, dropped after the test.
func mysqlURL(t *testing.T) string {
	admin, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/")
	if err != nil {
		t.Fatal(err)
	}
	name := unique("idem_cli_")
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		admin.Close()
		t.Fatalf("mariadb unreachable: %v", err)
	}
	t.Cleanup(func() {
		admin.Exec("DROP DATABASE " + name)
		admin.Close()
	})
	return "mysql://root@127.0.0.1:3306/" + name + "?layout=sharded&shards=4"
}

// open opens the store of url in namespace ns the way a library user
// would, from the same URL.
func openLib(t *testing.T, url, ns string) idem.Store {
	ctx := context.Background()
	var s idem.Store
	var err error
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	switch {
	case strings.HasPrefix(url, "postgres"):
		c, e := pgstore.FromURL(url + sep + "namespace=" + ns)
		if e != nil {
			t.Fatal(e)
		}
		s, err = c.Open(ctx)
	case strings.HasPrefix(url, "mysql"):
		c, e := mysqlstore.FromURL(url + sep + "namespace=" + ns)
		if e != nil {
			t.Fatal(e)
		}
		s, err = c.Open(ctx)
	default:
		c, e := redisstore.FromURL(url + sep + "namespace=" + ns)
		if e != nil {
			t.Fatal(e)
		}
		s, err = c.Open(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestOpsOnServers runs migrate, inspect, keys, stats, release, evict and gc
// on PostgreSQL (time-partitioned, archived), MariaDB (sharded) and Redis,
// each on a fresh schema, database or namespace.
func TestOpsOnServers(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
		key  string
	}{
		{"postgres", pgURL, "4194316293"}, // a Snowflake id: the layout is time-partitioned
		{"mysql", mysqlURL, "order-1"},
		{"redis", func(t *testing.T) string { return redisURL(t) }, "order-1"}, // a prefix of its own: the namespace's token counter stays after evict
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, ns := tc.url(t), unique("ns")
			g := []string{"--store", url, "--namespace", ns}
			with := func(a ...string) []string { return append(append([]string{}, g...), a...) }
			code, out, errs := cli(t, with("migrate")...)
			if code != 0 {
				t.Fatalf("migrate: %d %s %s", code, out, errs)
			}
			s := openLib(t, url, ns)
			ctx := context.Background()
			c, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte(tc.key), Lease: time.Hour, TTL: time.Hour})
			if err != nil || c.Outcome != idem.OutcomeAcquired {
				t.Fatalf("claim: %v %v", c.Outcome, err)
			}
			t.Cleanup(func() { s.Delete(context.Background(), []byte(tc.key)) })
			if code, out, errs = cli(t, with("keys", "--json")...); code != 0 || !strings.Contains(out, `"state": "in_progress"`) {
				t.Fatalf("keys: %d %s %s", code, out, errs)
			}
			var st map[string]int64
			if code, out, errs = cli(t, with("stats", "--json")...); code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["in_progress"] != 1 {
				t.Fatalf("stats: %d %s %s", code, out, errs)
			}
			if code, out, errs = cli(t, with("release", tc.key)...); code != 0 || !strings.Contains(out, "state:        released") {
				t.Fatalf("release: %d %s %s", code, out, errs)
			}
			if err := s.Complete(ctx, []byte(tc.key), c.Record.Token, nil); err == nil {
				t.Fatal("the holder completed after an operator released its key")
			}
			if code, _, errs = cli(t, with("release", tc.key)...); code != exitConflict {
				t.Fatalf("second release: %d %s", code, errs)
			}
			if code, out, errs = cli(t, with("gc", "--json")...); code != 0 || !strings.Contains(out, `"purged"`) {
				t.Fatalf("gc: %d %s %s", code, out, errs)
			}
			if tc.name == "postgres" && !strings.Contains(out, "partition(s)") {
				t.Fatalf("gc on a partitioned layout ran no partition maintenance: %s", out)
			}
			if code, _, errs = cli(t, with("evict", tc.key)...); code != 0 {
				t.Fatalf("evict: %d %s", code, errs)
			}
			if code, _, _ = cli(t, with("inspect", tc.key)...); code != exitNotFound {
				t.Fatalf("inspect after evict: %d", code)
			}
		})
	}
}

// TestUnreachableStores: a store that does not answer is exit 3 within
// --timeout, with a message naming it; a bad URL is exit 2.
func TestUnreachableStores(t *testing.T) {
	for _, url := range []string{
		"redis://127.0.0.1:1?dial_timeout=500ms",
		"postgres://postgres@127.0.0.1:1/test?connect_timeout=1",
		"mysql://root@127.0.0.1:1/test?timeout=1s",
	} {
		code, _, errs := cli(t, "--store", url, "--timeout", "5s", "inspect", "k")
		if code != exitUnavailable || !strings.Contains(errs, "unavailable") {
			t.Errorf("%s: exit %d, stderr %q; want %d", url, code, errs, exitUnavailable)
		}
	}
	for _, tc := range []struct{ url, msg string }{
		{"redis://h?bogus=1", "unexpected option"},
		{"postgres://h/db?layout=hashed", "layout"},
		{"mysql://h/a/b", "has a '/'"},
		{"rediss+cluster://h?db=2", "db"},
	} {
		code, _, errs := cli(t, "--store", tc.url, "stats")
		if code != exitUsage || !strings.Contains(errs, tc.msg) {
			t.Errorf("%s: exit %d, stderr %q; want %d containing %q", tc.url, code, errs, exitUsage, tc.msg)
		}
	}
}
