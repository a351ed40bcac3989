package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// internalPool is a pool on the test server, closed when t ends.
func internalPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := testDSN()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("postgres at %s unreachable: %v", dsn, err)
	}
	return pool
}

// testDSN is the test server: PGSTORE_DSN or the local PostgreSQL.
func testDSN() string {
	if d := os.Getenv("PGSTORE_DSN"); d != "" {
		return d
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// internalSchema names a fresh schema, dropped when t ends.
func internalSchema(t testing.TB, pool *pgxpool.Pool) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "pgstore_ti_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// failNth passes every call to the pool but makes the nth Query fail with
// a serialization failure (retryable) before it reaches the server.
type failNth struct {
	*pgxpool.Pool
	n, calls int
	failed   bool
}

func (f *failNth) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	f.calls++
	if f.calls == f.n {
		f.failed = true
		return nil, &pgconn.PgError{Code: codeSerializationFailure, Message: "injected"}
	}
	return f.Pool.Query(ctx, sql, args...)
}

// TestClaimBatchRetryKeepsInserted: when ClaimBatch's insert-only statement
// succeeded and the takeover statement for the keys that already had a row
// then fails with a retryable error, the retry must not send the freshly
// inserted keys again. It used to, and the takeover statement then found
// the batch's own new records and reported those keys in progress: the
// caller held them without knowing, and their messages waited out a lease.
func TestClaimBatchRetryKeepsInserted(t *testing.T) {
	pool := internalPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := Config{Pool: pool, Schema: internalSchema(t, pool), Table: "rec"}
	if err := Migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	old := idem.ClaimRequest{Key: []byte("old"), Lease: time.Minute, TTL: time.Hour}
	c, err := s.Claim(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, old.Key, c.Record.Token, []byte("done")); err != nil {
		t.Fatal(err)
	}
	reqs := []idem.ClaimRequest{
		{Key: []byte("new-1"), Lease: time.Minute, TTL: time.Hour},
		old,
		{Key: []byte("new-2"), Lease: time.Minute, TTL: time.Hour},
		{Key: []byte("new-1"), Lease: time.Minute, TTL: time.Hour}, // repeated: held by entry 0
	}
	q := &failNth{Pool: pool, n: 2} // 1: the insert-only statement, 2: the takeover
	res, err := s.claimBatch(ctx, q, reqs, false)
	if err != nil {
		t.Fatal(err)
	}
	if !q.failed {
		t.Fatalf("the takeover statement was never sent (%d queries): the test no longer covers the retry", q.calls)
	}
	want := []idem.Outcome{idem.OutcomeAcquired, idem.OutcomeCompleted, idem.OutcomeAcquired, idem.OutcomeInProgress}
	for i, r := range res {
		if r.Err != nil || r.Claim.Outcome != want[i] {
			t.Errorf("entry %d (%s): %v %v, want %v", i, reqs[i].Key, r.Claim.Outcome, r.Err, want[i])
		}
	}
	for _, i := range []int{0, 2} {
		got, err := s.Get(ctx, reqs[i].Key)
		if err != nil || got.Token != res[i].Claim.Record.Token || got.State != idem.StateInProgress {
			t.Errorf("%s stored as %+v %v, claim returned token %d", reqs[i].Key, got, err, res[i].Claim.Record.Token)
		}
	}
}

// hookQ runs before(n) ahead of the nth Query (from 1) sent through it.
type hookQ struct {
	querier
	calls  int
	before func(n int)
}

func (h *hookQ) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	h.calls++
	h.before(h.calls)
	return h.querier.Query(ctx, sql, args...)
}

// TestClaimBatchTakeoverPartitionDropped: ClaimBatch's insert-only
// statement finds an expired record of the key (so the key goes to the
// takeover statement), and before the takeover statement runs, another
// Store value drops the partition (it holds no live record). The takeover
// statement then finds no partition: ClaimBatch must recreate it and
// acquire the key. (In a caller's transaction this cannot happen: the
// insert-only statement's lock on the partition makes the drop give up.)
func TestClaimBatchTakeoverPartitionDropped(t *testing.T) {
	pool := internalPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := Config{Pool: pool, Schema: internalSchema(t, pool), Table: "pt", Layout: LayoutTimePartitioned, KeyTime: UUIDv7KeyTime, Precreate: 1}
	if err := Migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dropper, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -12)
	key := make([]byte, 16)
	ms := day.Add(time.Hour).UnixMilli()
	for j := range 6 {
		key[j] = byte(ms >> (40 - 8*j))
	}
	key[6], key[8] = 0x70, 0x80
	c, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Lease: time.Millisecond, TTL: time.Millisecond})
	if err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("%+v, %v", c, err)
	}
	time.Sleep(10 * time.Millisecond) // the record expires
	name := s.partitionName(day)
	dropped := false
	h := &hookQ{querier: pool, before: func(n int) {
		if n != 2 {
			return
		}
		names, err := dropper.DropExpiredPartitions(ctx)
		if err != nil {
			t.Error(err)
		}
		dropped = slices.Contains(names, name)
	}}
	res, err := s.claimBatch(ctx, h, []idem.ClaimRequest{{Key: key, Lease: time.Minute, TTL: time.Hour}}, false)
	if !dropped {
		t.Fatalf("partition %s was not dropped before the takeover statement (%d queries)", name, h.calls)
	}
	if err != nil || res[0].Err != nil || res[0].Claim.Outcome != idem.OutcomeAcquired {
		t.Fatalf("%+v, %v; want acquired", res, err)
	}
	if rec, err := s.Get(ctx, key); err != nil || rec.Token != res[0].Claim.Record.Token {
		t.Fatalf("record %+v, %v", rec, err)
	}
}
