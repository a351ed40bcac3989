//go:build linux

package boltstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/idem-dev/idem"
)

// TestReadersNeverSeeUnsyncedCommit holds bbolt between the write of a
// commit's meta page and its fdatasync (the window in which bbolt already
// shows the commit to new read transactions) and checks that Get and a
// claim answered from a read transaction do not report the completion that
// commit holds: they wait for the fdatasync. A key the commit does not
// write is answered at once. If the fdatasync then fails, the waiting
// readers fail with idem.ErrUnavailable rather than report a state that may
// not be on disk, and the completing caller gets idem.ErrUnknownOutcome.
func TestReadersNeverSeeUnsyncedCommit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		errno syscall.Errno
	}{{"FsyncSucceeds", 0}, {"FsyncFails", syscall.EIO}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFaultFS(t)
			s := openTemp(t, func(c *Config) { c.Path = f.path("idem.db"); c.SweepInterval = -1 })
			ctx := context.Background()
			other, err := s.Claim(ctx, claimReq("other"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := s.Claim(ctx, claimReq("k"))
			if err != nil {
				t.Fatal(err)
			}
			base := f.metaTxid("idem.db")
			paused, release := make(chan struct{}), make(chan struct{})
			var once, released sync.Once
			free := func() { released.Do(func() { close(release) }) }
			t.Cleanup(free) // before the store closes: its commit loop may be held in the fsync
			f.onFsync(func(txid uint64) syscall.Errno {
				if txid <= base {
					return 0 // the data pages' fdatasync
				}
				hit := false
				once.Do(func() { hit = true; close(paused); <-release })
				if hit {
					return tc.errno
				}
				return 0
			})
			completed := make(chan error, 1)
			go func() { completed <- s.Complete(ctx, []byte("k"), c.Record.Token, []byte("r")) }()
			<-paused // the Complete's meta page is written, its fdatasync held
			waiting := make(chan struct{}, 3)
			s.b.readerWaits = func() { waiting <- struct{}{} }

			got := make(chan error, 1)
			go func() {
				r, err := s.Get(ctx, []byte("other"))
				if err == nil && (r.State != idem.StateInProgress || r.Token != other.Record.Token) {
					err = errors.New(r.State.String())
				}
				got <- err
			}()
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("Get of a key the held commit does not write: %v", err)
				}
			case <-waiting:
				t.Fatal("Get of a key the held commit does not write waited for its fdatasync")
			}

			type answer struct {
				what  string
				state idem.State
				err   error
			}
			answers := make(chan answer, 2)
			go func() {
				r, err := s.Get(ctx, []byte("k"))
				answers <- answer{"Get", r.State, err}
			}()
			go func() {
				cl, err := s.Claim(ctx, claimReq("k"))
				answers <- answer{"Claim", cl.Record.State, err}
			}()
			for range 2 {
				select {
				case a := <-answers:
					if a.err == nil && a.state == idem.StateCompleted {
						t.Fatalf("%s reported the completion while its commit's fdatasync had not returned: a power cut now would lose it", a.what)
					}
					t.Fatalf("%s answered during the fdatasync: %s, %v", a.what, a.state, a.err)
				case <-waiting:
				}
			}
			free()
			err = <-completed
			for range 2 {
				a := <-answers
				switch {
				case tc.errno == 0 && (a.err != nil || a.state != idem.StateCompleted):
					t.Fatalf("%s after the fdatasync: %s, %v; want completed", a.what, a.state, a.err)
				case tc.errno != 0 && (!errors.Is(a.err, idem.ErrUnavailable) || !errors.Is(a.err, tc.errno)):
					t.Fatalf("%s after a failed fdatasync: %s, %v; want idem.ErrUnavailable (the state may not be on disk)", a.what, a.state, a.err)
				}
			}
			switch {
			case tc.errno == 0 && err != nil:
				t.Fatalf("Complete: %v", err)
			case tc.errno != 0 && (!errors.Is(err, idem.ErrUnknownOutcome) || !errors.Is(err, tc.errno)):
				t.Fatalf("Complete whose meta fdatasync failed: %v, want idem.ErrUnknownOutcome", err)
			}
		})
	}
}

// TestFdatasyncErrorDisablesWrites: an fdatasync error of any kind, ENOSPC
// included, disables writes until the store is reopened, whether bbolt met
// it syncing the data pages (nothing applied: idem.ErrUnavailable; reads of
// the last durable state go on) or the meta page (idem.ErrUnknownOutcome;
// reads are refused too, since the state they would see may not be on
// disk). After a reopen on a healthy disk the store works again.
func TestFdatasyncErrorDisablesWrites(t *testing.T) {
	for _, tc := range []struct {
		name  string
		errno syscall.Errno
		meta  bool // fail the meta page's fdatasync, else the data pages'
	}{
		{"DataEIO", syscall.EIO, false}, {"DataENOSPC", syscall.ENOSPC, false},
		{"MetaEIO", syscall.EIO, true}, {"MetaENOSPC", syscall.ENOSPC, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFaultFS(t)
			path := f.path("idem.db")
			ctx := context.Background()
			s, err := Open(Config{Path: path, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			c, err := s.Claim(ctx, claimReq("before"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, []byte("before"), c.Record.Token, []byte("ok")); err != nil {
				t.Fatal(err)
			}
			base := f.metaTxid("idem.db")
			var hits atomic.Int32
			f.onFsync(func(txid uint64) syscall.Errno {
				if tc.meta != (txid > base) || hits.Add(1) != 1 {
					return 0
				}
				return tc.errno
			})
			_, err = s.Claim(ctx, claimReq("during"))
			if hits.Load() != 1 {
				t.Fatalf("the fault was not hit by the claim's commit (err %v)", err)
			}
			want := idem.ErrUnavailable
			if tc.meta {
				want = idem.ErrUnknownOutcome
			}
			if !errors.Is(err, want) || !errors.Is(err, tc.errno) {
				t.Fatalf("claim whose commit's fdatasync failed: %v, want %v wrapping %v", err, want, tc.errno)
			}
			f.onFsync(nil) // the disk is healthy again: the store still refuses writes
			if _, err := s.Claim(ctx, claimReq("after")); !errors.Is(err, idem.ErrUnavailable) {
				t.Fatalf("claim after the fdatasync failure: %v, want idem.ErrUnavailable until reopen", err)
			}
			if err := s.Delete(ctx, []byte("before")); !errors.Is(err, idem.ErrUnavailable) {
				t.Fatalf("delete after the fdatasync failure: %v", err)
			}
			if err := s.Ping(ctx); !errors.Is(err, idem.ErrUnavailable) {
				t.Fatalf("ping after the fdatasync failure: %v", err)
			}
			r, err := s.Get(ctx, []byte("before"))
			if tc.meta {
				if !errors.Is(err, idem.ErrUnavailable) {
					t.Fatalf("read after the meta fdatasync failed: %+v %v, want idem.ErrUnavailable", r, err)
				}
			} else {
				if err != nil || string(r.Result) != "ok" {
					t.Fatalf("read after the data fdatasync failed: %+v %v", r, err)
				}
				if cl, err := s.Claim(ctx, claimReq("before")); err != nil || cl.Outcome != idem.OutcomeCompleted {
					t.Fatalf("replay after the data fdatasync failed: %+v %v", cl, err)
				}
				if _, err := s.Get(ctx, []byte("during")); !errors.Is(err, idem.ErrNotFound) {
					t.Fatalf("the claim whose data fdatasync failed is visible: %v", err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(Config{Path: path, SweepInterval: -1})
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer s2.Close()
			if r, err := s2.Get(ctx, []byte("before")); err != nil || string(r.Result) != "ok" {
				t.Fatalf("after reopen: %+v %v", r, err)
			}
			// "during" is absent if nothing was applied; after a meta
			// fdatasync failure it is whatever reached the file.
			r, err = s2.Get(ctx, []byte("during"))
			t.Logf("after reopen, the claim of unknown outcome reads: %s %v", r.State, err)
			if !tc.meta && !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("after reopen, the claim that applied nothing is visible: %+v %v", r, err)
			}
			if cl, err := s2.Claim(ctx, claimReq("after")); err != nil || cl.Outcome != idem.OutcomeAcquired {
				t.Fatalf("claim after reopen: %+v %v", cl, err)
			}
		})
	}
}
