package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dsn() string {
	if d := os.Getenv("PGSTORE_DSN"); d != "" {
		return d
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("postgres unreachable: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "pgstore_m_" + hex.EncodeToString(b[:])
	defer pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	cases := [][]string{
		{"-layout", "single", "-table", "a"},
		{"-layout", "single", "-table", "a"}, // idempotent
		{"-layout", "sharded", "-shards", "4", "-table", "b"},
		{"-layout", "time_ordered", "-keytime", "ulid", "-table", "c"},
		{"-layout", "time_partitioned", "-period", "week", "-table", "d", "-drop-expired"},
	}
	for _, args := range cases {
		var out bytes.Buffer
		if err := run(ctx, append([]string{"-dsn", dsn(), "-schema", schema}, args...), &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out.String(), "schema version") {
			t.Fatalf("%v: output %q", args, out.String())
		}
	}
	// Changing the layout of an existing table is refused.
	if err := run(ctx, []string{"-dsn", dsn(), "-schema", schema, "-table", "a", "-layout", "sharded"}, &bytes.Buffer{}); err == nil {
		t.Fatal("layout change accepted")
	}
	if err := run(ctx, []string{"-layout", "single"}, &bytes.Buffer{}); err == nil && os.Getenv("DATABASE_URL") == "" {
		t.Fatal("missing -dsn accepted")
	}
}
