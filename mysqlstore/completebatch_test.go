package mysqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

func claimN(t testing.TB, s *mysqlstore.Store, prefix string, n int, lease time.Duration) []idem.Completion {
	t.Helper()
	reqs := make([]idem.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = idem.ClaimRequest{Key: fmt.Appendf(nil, "%s-%d", prefix, i), Lease: lease, TTL: time.Hour}
	}
	res, err := s.ClaimBatch(testCtx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]idem.Completion, n)
	for i, r := range res {
		if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
			t.Fatalf("claim %q: %+v", reqs[i].Key, r)
		}
		cs[i] = idem.Completion{Key: reqs[i].Key, Token: r.Claim.Record.Token, Result: fmt.Appendf(nil, "r-%s", reqs[i].Key)}
	}
	return cs
}

func checkErrs(t *testing.T, errs []error, want []error) {
	t.Helper()
	if len(errs) != len(want) {
		t.Fatalf("%d errors for %d entries", len(errs), len(want))
	}
	for i, w := range want {
		if (w == nil && errs[i] != nil) || (w != nil && !errors.Is(errs[i], w)) {
			t.Errorf("entry %d: %v, want %v", i, errs[i], w)
		}
	}
}

// Duplicate keys in one call are answered as sequential Completes would be.
func TestCompleteBatchDuplicatesInOrder(t *testing.T) {
	for name, cfg := range layoutConfigs() {
		t.Run(name, func(t *testing.T) {
			s, _ := newStore(t, cfg)
			ctx := testCtx(t)
			u := 50 * time.Millisecond
			stale := claimN(t, s, "s", 2, u)
			time.Sleep(3 * u)
			cur := claimN(t, s, "s", 3, time.Minute) // s-0, s-1 taken over; s-2 new
			done := claimN(t, s, "d", 1, time.Minute)[0]
			if err := s.Complete(ctx, done.Key, done.Token, []byte("first")); err != nil {
				t.Fatal(err)
			}
			k0, k1, k2 := cur[0], cur[1], cur[2]
			with := func(c idem.Completion, res string) idem.Completion { c.Result = []byte(res); return c }
			cs := []idem.Completion{
				with(k2, "one"), with(k2, "two"), // same token twice: first result wins, both nil
				stale[0], k0, // stale then current
				k1, stale[1], // current then stale
				with(done, "again"), // repeat of an earlier Complete
				{Key: k2.Key, Token: k2.Token + 1_000_000, Result: nil}, // foreign token after completion
				{Key: []byte("s-none"), Token: 1},
			}
			errs, err := s.CompleteBatch(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			checkErrs(t, errs, []error{nil, nil, idem.ErrFenced, nil, nil, idem.ErrFenced, nil, idem.ErrFenced, idem.ErrNotFound})
			for _, w := range []struct {
				c   idem.Completion
				res string
			}{{k2, "one"}, {k0, string(k0.Result)}, {k1, string(k1.Result)}, {done, "first"}} {
				r, err := s.Get(ctx, w.c.Key)
				if err != nil || r.State != idem.StateCompleted || r.Token != w.c.Token || string(r.Result) != w.res {
					t.Errorf("%q: %+v %v, want completed by %d with %q", w.c.Key, r, err, w.c.Token, w.res)
				}
			}
			// The whole batch again: every entry that applied is an idempotent repeat.
			again, err := s.CompleteBatch(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			for i := range errs {
				if (errs[i] == nil) != (again[i] == nil) {
					t.Errorf("entry %d: %v on repeat, %v first", i, again[i], errs[i])
				}
			}
		})
	}
}

// statements counts the statements the server ran for db's only connection.
func statements(t *testing.T, db *sql.DB) func() int {
	t.Helper()
	read := func() int {
		var name string
		var n int
		if err := db.QueryRowContext(testCtx(t), "SHOW SESSION STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := read()
	idle := read() - base // the reading statement itself
	base += idle
	return func() int {
		n := read() - base - idle
		base += n + idle
		return n
	}
}

// The common case, every entry held by its token, is one statement (one
// round trip) for the whole batch; a batch with entries that do not apply
// adds one read.
func TestCompleteBatchOneStatement(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	db.SetMaxOpenConns(1) // every statement on one session, so its counter sees them all
	ctx := testCtx(t)
	cs := claimN(t, s, "k", 100, time.Minute)
	count := statements(t, db)
	errs, err := s.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	checkErrs(t, errs, make([]error, len(cs)))
	if n := count(); n != 1 {
		t.Fatalf("CompleteBatch of 100 held claims ran %d statements, want 1", n)
	}
	errs, err = s.CompleteBatch(ctx, append(cs[:1:1], idem.Completion{Key: []byte("none"), Token: 9}))
	if err != nil {
		t.Fatal(err)
	}
	checkErrs(t, errs, []error{nil, idem.ErrNotFound})
	if n := count(); n != 2 {
		t.Fatalf("CompleteBatch with an unknown key ran %d statements, want 2 (update, read)", n)
	}
	if errs, err := s.CompleteBatch(ctx, []idem.Completion{{Key: nil, Token: 1}, {Key: []byte("x"), Token: 0}}); err != nil {
		t.Fatal(err)
	} else {
		checkErrs(t, errs, []error{idem.ErrInvalidKey, idem.ErrInvalidArgument})
	}
	if n := count(); n != 0 {
		t.Fatalf("a batch of invalid entries ran %d statements", n)
	}
}

// Large batches split by MaxBatch and by statement size (1 MiB results),
// sharded chunks run in parallel; every result lands intact.
func TestCompleteBatchChunks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    mysqlstore.Config
		n      int
		result int
	}{
		{"max_batch", mysqlstore.Config{MaxBatch: 7}, 50, 10},
		{"sharded", mysqlstore.Config{Layout: mysqlstore.LayoutSharded, Shards: 4, MaxBatch: 5}, 50, 10},
		{"big_results", mysqlstore.Config{}, 12, idem.MaxResultLen},
		{"mixed_results", mysqlstore.Config{}, 20, -7001}, // entry i: i*7001 bytes, 0 to 133 KiB
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t, tc.cfg)
			ctx := testCtx(t)
			cs := claimN(t, s, "c", tc.n, time.Minute)
			for i := range cs {
				n := tc.result
				if n < 0 {
					n = -n * i
				}
				cs[i].Result = bytes.Repeat([]byte{byte(i), 0, 0xff}, n/3+1)[:n]
			}
			errs, err := s.CompleteBatch(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			checkErrs(t, errs, make([]error, len(cs)))
			for _, c := range cs {
				r, err := s.Get(ctx, c.Key)
				if err != nil || r.State != idem.StateCompleted || !bytes.Equal(r.Result, c.Result) {
					t.Fatalf("%q: state %v, %d result bytes, %v", c.Key, r.State, len(r.Result), err)
				}
			}
		})
	}
}

// Concurrent batches over the same held claims (a redelivered batch
// settled twice) all succeed: sorted rows, deadlocks retried.
func TestCompleteBatchConcurrent(t *testing.T) {
	s, _ := newStore(t, mysqlstore.Config{Layout: mysqlstore.LayoutSharded, Shards: 4})
	ctx := testCtx(t)
	cs := claimN(t, s, "p", 200, time.Minute)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			mine := append([]idem.Completion(nil), cs...)
			for i := range mine { // a different order per worker
				j := (i*(w+3) + w) % len(mine)
				mine[i], mine[j] = mine[j], mine[i]
			}
			errs, err := s.CompleteBatch(ctx, mine)
			if err != nil {
				t.Error(err)
				return
			}
			for i, e := range errs {
				if e != nil {
					t.Errorf("worker %d entry %q: %v", w, mine[i].Key, e)
				}
			}
		})
	}
	wg.Wait()
}

func TestCompleteBatchClosedOrCancelled(t *testing.T) {
	s, _ := newStore(t, mysqlstore.Config{})
	cs := []idem.Completion{{Key: []byte("k"), Token: 1}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if errs, err := s.CompleteBatch(ctx, cs); !errors.Is(err, context.Canceled) || errs != nil {
		t.Fatalf("cancelled: %v %v", errs, err)
	}
	s.Close()
	if errs, err := s.CompleteBatch(testCtx(t), cs); !errors.Is(err, idem.ErrClosed) || errs != nil {
		t.Fatalf("closed: %v %v", errs, err)
	}
}
