package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem"
)

// claimN claims n fresh keys and returns the completions of them.
func claimN(t *testing.T, s *Store, prefix string, n int) []idem.Completion {
	t.Helper()
	reqs := make([]idem.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = claimReq(fmt.Sprint(prefix, i))
	}
	res, err := s.ClaimBatch(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]idem.Completion, n)
	for i, r := range res {
		if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
			t.Fatalf("claim %s: %+v", reqs[i].Key, r)
		}
		cs[i] = idem.Completion{Key: reqs[i].Key, Token: r.Claim.Record.Token, Result: []byte("r-" + string(reqs[i].Key))}
	}
	return cs
}

// CompleteBatch is one operation of the commit loop: one commit for the
// whole batch, and each entry answered as Complete would answer it
// (checked here against Complete on the same records afterwards).
func TestCompleteBatchOneCommit(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, func(c *Config) { c.SweepInterval = -1 })
	cs := claimN(t, s, "k", 50)
	cs = append(cs,
		idem.Completion{Key: cs[0].Key, Token: cs[0].Token, Result: []byte("again")}, // repeat in the same batch
		idem.Completion{Key: cs[1].Key, Token: cs[1].Token + 1000},                   // fenced
		idem.Completion{Key: []byte("absent"), Token: 1},                             // not found
		idem.Completion{Key: nil, Token: 1},                                          // invalid key
		idem.Completion{Key: []byte("x"), Token: 0},                                  // invalid token
		idem.Completion{Key: []byte("x"), Token: 1, Result: make([]byte, idem.MaxResultLen+1)},
	)
	before := s.b.commits.Load()
	errs, err := s.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.b.commits.Load() - before; n != 1 {
		t.Fatalf("%d commits for one CompleteBatch", n)
	}
	for i, c := range cs {
		// Complete again on the settled records answers the same (repeats of
		// a completion are no-ops; the rest change nothing).
		single := s.Complete(ctx, c.Key, c.Token, c.Result)
		if (errs[i] == nil) != (single == nil) {
			t.Fatalf("entry %d (%q): batch %v, single %v", i, c.Key, errs[i], single)
		}
		for _, e := range []error{idem.ErrFenced, idem.ErrNotFound, idem.ErrInvalidKey, idem.ErrInvalidArgument} {
			if errors.Is(errs[i], e) != errors.Is(single, e) {
				t.Fatalf("entry %d (%q): batch %v, single %v", i, c.Key, errs[i], single)
			}
		}
	}
	for i := range 50 {
		if errs[i] != nil {
			t.Fatalf("entry %d: %v", i, errs[i])
		}
		r, err := s.Get(ctx, cs[i].Key)
		if err != nil || r.State != idem.StateCompleted || string(r.Result) != "r-"+string(cs[i].Key) {
			t.Fatalf("%s: %+v %v", cs[i].Key, r, err)
		}
	}
	want := []error{nil, idem.ErrFenced, idem.ErrNotFound, idem.ErrInvalidKey, idem.ErrInvalidArgument, idem.ErrInvalidArgument}
	for j, w := range want {
		if e := errs[50+j]; (w == nil) != (e == nil) || (w != nil && !errors.Is(e, w)) {
			t.Fatalf("entry %d: %v, want %v", 50+j, e, w)
		}
	}
	if st, err := s.Stats(ctx); err != nil || st != (idem.Stats{Completed: 50}) {
		t.Fatalf("stats %+v %v", st, err)
	}
	// Only invalid entries: nothing is queued.
	before = s.b.commits.Load()
	if errs, err := s.CompleteBatch(ctx, []idem.Completion{{Key: nil, Token: 1}}); err != nil || !errors.Is(errs[0], idem.ErrInvalidKey) {
		t.Fatalf("invalid-only batch: %v %v", errs, err)
	}
	if n := s.b.commits.Load() - before; n != 0 {
		t.Fatalf("invalid-only batch committed %d times", n)
	}
}

// A failed commit fails the whole call and reports no entry done. Injected
// before bbolt's Commit, nothing is applied either way (ErrUnavailable);
// disk full leaves writes enabled, an fsync error disables them until
// reopen. TestFdatasyncErrorDisablesWrites has real fdatasync failures.
func TestCompleteBatchCommitFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		want   error
		sticky bool
	}{
		{"DiskFull", &os.PathError{Op: "write", Err: syscall.ENOSPC}, idem.ErrUnavailable, false},
		{"FsyncError", syscall.EIO, idem.ErrUnavailable, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := openTemp(t, func(c *Config) { c.SweepInterval = -1 })
			cs := claimN(t, s, "k", 10)
			s.b.beforeCommit = func(*bbolt.Tx) error { return tc.err }
			errs, err := s.CompleteBatch(ctx, cs)
			s.b.beforeCommit = nil
			if !errors.Is(err, tc.want) || errs != nil {
				t.Fatalf("CompleteBatch: %v %v, want %v", errs, err, tc.want)
			}
			for _, c := range cs {
				if r, err := s.Get(ctx, c.Key); err != nil || r.State != idem.StateInProgress {
					t.Fatalf("%s after failed commit: %+v %v", c.Key, r, err)
				}
			}
			errs, err = s.CompleteBatch(ctx, cs)
			if tc.sticky {
				if !errors.Is(err, idem.ErrUnavailable) {
					t.Fatalf("after fsync failure: %v %v", errs, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("retry: %v", err)
			}
			for i, e := range errs {
				if e != nil {
					t.Fatalf("retry entry %d: %v", i, e)
				}
			}
		})
	}
}

// A caller whose context is done gets its error and nothing is applied.
func TestCompleteBatchContextDone(t *testing.T) {
	s := openTemp(t, func(c *Config) { c.SweepInterval = -1 })
	cs := claimN(t, s, "k", 3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if errs, err := s.CompleteBatch(ctx, cs); !errors.Is(err, context.Canceled) || errs != nil {
		t.Fatalf("done context: %v %v", errs, err)
	}
	for _, c := range cs {
		if r, err := s.Get(context.Background(), c.Key); err != nil || r.State != idem.StateInProgress {
			t.Fatalf("%s: %+v %v", c.Key, r, err)
		}
	}
}
