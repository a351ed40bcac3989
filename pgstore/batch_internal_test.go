package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

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
	dsn := os.Getenv("PGSTORE_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("postgres at %s unreachable: %v", dsn, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "pgstore_ti_" + hex.EncodeToString(b[:])
	defer func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	}()
	cfg := Config{Pool: pool, Schema: schema, Table: "rec"}
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
