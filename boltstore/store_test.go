package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem"
)

func TestMain(m *testing.M) {
	if runChild() {
		return
	}
	goleak.VerifyTestMain(m)
}

func openTemp(t testing.TB, mod func(*Config)) *Store {
	t.Helper()
	cfg := Config{Path: filepath.Join(t.TempDir(), "idem.db")}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func claimReq(key string) idem.ClaimRequest {
	return idem.ClaimRequest{Key: []byte(key), Lease: time.Minute, TTL: time.Hour}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, nil)
	c, err := s.Claim(ctx, claimReq("k"))
	if err != nil || c.Outcome != idem.OutcomeAcquired || c.Record.Token == 0 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if c2, err := s.Claim(ctx, claimReq("k")); err != nil || c2.Outcome != idem.OutcomeInProgress {
		t.Fatalf("second claim: %+v %v", c2, err)
	}
	if err := s.Complete(ctx, []byte("k"), c.Record.Token+1, nil); !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("stale complete: %v", err)
	}
	if err := s.Complete(ctx, []byte("k"), c.Record.Token, []byte("res")); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, []byte("k"), c.Record.Token, []byte("other")); err != nil {
		t.Fatalf("repeat complete: %v", err)
	}
	c3, err := s.Claim(ctx, claimReq("k"))
	if err != nil || c3.Outcome != idem.OutcomeCompleted || string(c3.Record.Result) != "res" {
		t.Fatalf("replay: %+v %v", c3, err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Completed != 1 || st.Total() != 1 {
		t.Fatalf("stats: %+v %v", st, err)
	}
	if err := s.Delete(ctx, []byte("k")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	c4, err := s.Claim(ctx, claimReq("k"))
	if err != nil || c4.Outcome != idem.OutcomeAcquired || c4.Record.Token <= c.Record.Token {
		t.Fatalf("claim after delete: %+v %v (first token %d)", c4, err, c.Record.Token)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTokensGrowAcrossReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	var last uint64
	for i := range 3 {
		s, err := Open(Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.Claim(ctx, claimReq(fmt.Sprint("k", i)))
		if err != nil {
			t.Fatal(err)
		}
		if c.Record.Token <= last {
			t.Fatalf("token %d after %d", c.Record.Token, last)
		}
		last = c.Record.Token
		if err := s.Delete(ctx, []byte(fmt.Sprint("k", i))); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
}

func TestSecondOpenInUse(t *testing.T) {
	s := openTemp(t, nil)
	start := time.Now()
	_, err := Open(Config{Path: s.Path(), LockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrInUse) || !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("second open: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("second open hung for %s", time.Since(start))
	}
	t.Log(err)
}

func TestClosed(t *testing.T) {
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "idem.db")})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := s.Claim(context.Background(), claimReq("k")); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("claim after close: %v", err)
	}
	if _, err := os.Stat(s.Path()); err != nil {
		t.Fatal(err)
	}
}

// Every operation of a failed group commit fails; none is reported done.
func TestGroupCommitFailsTogether(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, func(c *Config) { c.SweepInterval = -1 })
	gate := make(chan struct{})
	var commits atomic.Int32
	s.b.beforeCommit = func(*bbolt.Tx) error {
		if commits.Add(1) == 1 {
			<-gate // hold the first commit so that the others queue up
			return nil
		}
		return &os.PathError{Op: "write", Path: s.Path(), Err: syscall.ENOSPC}
	}
	first := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, claimReq("first")); first <- err }()
	for commits.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	const n = 20
	errs := make(chan error, n)
	for i := range n {
		go func() { _, err := s.Claim(ctx, claimReq(fmt.Sprint("k", i))); errs <- err }()
	}
	time.Sleep(50 * time.Millisecond) // let them queue behind the held commit
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	failed := 0
	for range n {
		if err := <-errs; err != nil {
			if !errors.Is(err, idem.ErrUnavailable) {
				t.Fatalf("want ErrUnavailable, got %v", err)
			}
			failed++
		}
	}
	for i := range n {
		_, err := s.Get(ctx, []byte(fmt.Sprint("k", i)))
		if !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("k%d present after its commit failed: %v", i, err)
		}
	}
	if failed != n {
		t.Fatalf("%d of %d failed", failed, n)
	}
	t.Logf("%d commits for %d operations", commits.Load(), n+1)
}

// A caller whose context ends while its operation waits in the queue gets
// the context's error and the operation is dropped, not applied later.
func TestContextCancelledInQueue(t *testing.T) {
	s := openTemp(t, func(c *Config) { c.SweepInterval = -1 })
	gate := make(chan struct{})
	var once sync.Once
	s.b.beforeCommit = func(*bbolt.Tx) error { once.Do(func() { <-gate }); return nil }
	go s.Claim(context.Background(), claimReq("holder"))
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, claimReq("queued")); res <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	err := <-res
	close(gate)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	if errors.Is(err, idem.ErrUnknownOutcome) {
		return // it had been taken into the held commit already
	}
	if _, err := s.Claim(context.Background(), claimReq("sync")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), []byte("queued")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("cancelled claim was applied: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{Path: "x.db"}, true},
		{"full", Config{Path: "x.db", Namespace: "a.b-c_1", Fsync: FsyncAlways, MaxBatch: 10, SweepInterval: -1, SweepChunk: 5, LockTimeout: time.Second}, true},
		{"no path", Config{}, false},
		{"bad namespace", Config{Path: "x.db", Namespace: "a/b"}, false},
		{"bad fsync", Config{Path: "x.db", Fsync: "never"}, false},
		{"negative batch", Config{Path: "x.db", MaxBatch: -1}, false},
		{"negative chunk", Config{Path: "x.db", SweepChunk: -1}, false},
		{"negative lock timeout", Config{Path: "x.db", LockTimeout: -1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, idem.ErrInvalidArgument)) {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// The background sweeper removes expired records of every namespace in the
// file, not just the one Open served.
func TestSweeper(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	s := openTemp(t, func(c *Config) { c.Clock = clk; c.SweepInterval = 5 * time.Millisecond; c.SweepChunk = 3 })
	other, err := s.Namespace("other")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, st := range []*Store{s, other} {
		reqs := make([]idem.ClaimRequest, 10)
		for i := range reqs {
			reqs[i] = idem.ClaimRequest{Key: []byte(fmt.Sprint("k", i)), Lease: time.Second, TTL: time.Second}
		}
		reqs[0].TTL, reqs[0].Lease = time.Hour, time.Hour
		if _, err := st.ClaimBatch(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(2 * time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for _, st := range []*Store{s, other} {
		for {
			var stored int
			if err := st.b.bolt.View(func(tx *bbolt.Tx) error {
				sp, err := spaceOf(tx, st.name)
				stored = sp.r.Stats().KeyN
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if stored == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("namespace %q: %d records left, want the 1 unexpired", st.ns, stored)
			}
			time.Sleep(5 * time.Millisecond)
		}
		checkIndexes(t, st, clk.Now())
	}
}
