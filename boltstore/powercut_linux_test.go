//go:build linux

package boltstore

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// TestPowerCut simulates power cuts on the FUSE file system: the "disk" is
// the image of the file as of its last successful fsync; at a random meta
// page fdatasync the power goes (that fsync and every later one fail, and
// nothing written after the last good fsync reaches the image). Writers claim
// and complete keys while readers read the keys whose completion is in
// flight. After each cut the image is opened (with the full check) and must
// hold every completion that was acknowledged and every completion that a
// Get or a claim reported: an answer given before the cut is never undone by
// it. Unacknowledged operations may be found either way.
func TestPowerCut(t *testing.T) {
	rounds := 3 // with readers that did not wait, round 0 failed in 3 runs of 3
	if testing.Short() {
		rounds = 1
	}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	acked, seen := 0, 0
	for round := range rounds {
		a, s := powerCutRound(t, round, 20+rng.IntN(60))
		acked += a
		seen += s
	}
	t.Logf("%d power cuts: %d acknowledged completions and %d completions reported by readers, all found after the cut", rounds, acked, seen)
	if seen == 0 {
		t.Fatal("no reader reported a completion: the test checked nothing about readers")
	}
}

func powerCutRound(t *testing.T, round, cutAfter int) (ackedN, seenN int) {
	f := newFaultFS(t)
	image := filepath.Join(t.TempDir(), "image.db")
	var (
		mu    sync.Mutex
		syncs int
		cut   bool
		down  = make(chan struct{})
	)
	copyImage := func() {
		b, err := os.ReadFile(filepath.Join(f.back, "idem.db"))
		if err == nil {
			err = os.WriteFile(image, b, 0o600)
		}
		if err != nil {
			t.Errorf("copy the disk image: %v", err)
		}
	}
	var imageTxid uint64
	f.onFsync(func(txid uint64) syscall.Errno {
		mu.Lock()
		defer mu.Unlock()
		if cut {
			return syscall.EIO
		}
		if syncs++; syncs > cutAfter && txid > imageTxid {
			// A meta page fdatasync: the commit is visible to readers and
			// not durable. The power goes now; leave the readers a moment
			// in the window.
			cut = true
			close(down)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			return syscall.EIO
		}
		copyImage() // everything written so far is durable after this fsync
		imageTxid = txid
		return 0
	})
	s, err := Open(Config{Path: f.path("idem.db"), SweepInterval: -1, InitialMmapSize: 1 << 20, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("round %d: %v", round, err)
	}
	ctx := context.Background()
	var (
		amu      sync.Mutex
		acked    []string
		observed = map[string]bool{}
		inflight [64]atomic.Pointer[string]
		slot     atomic.Int64
		wg       sync.WaitGroup
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				key := fmt.Sprintf("r%d-w%d-%d", round, w, i)
				c, err := s.Claim(ctx, claimReq(key))
				if err != nil {
					return // the power is gone
				}
				inflight[slot.Add(1)%int64(len(inflight))].Store(&key)
				if err := s.Complete(ctx, []byte(key), c.Record.Token, []byte("result-"+key)); err != nil {
					return
				}
				amu.Lock()
				acked = append(acked, key)
				amu.Unlock()
			}
		}()
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := r; ; i++ {
				select {
				case <-down:
					// Keep reading a little after the cut: the window is now.
					time.Sleep(40 * time.Millisecond)
					return
				default:
				}
				k := inflight[i%len(inflight)].Load()
				if k == nil {
					continue
				}
				var completed bool
				if i%2 == 0 {
					rec, err := s.Get(ctx, []byte(*k))
					completed = err == nil && rec.State == idem.StateCompleted
				} else {
					c, err := s.Claim(ctx, claimReq(*k))
					completed = err == nil && c.Outcome == idem.OutcomeCompleted
				}
				if completed {
					amu.Lock()
					observed[*k] = true
					amu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatalf("round %d: close: %v", round, err)
	}
	f.onFsync(nil)

	s2, err := Open(Config{Path: image, SweepInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("round %d: the disk image after the cut does not open: %v", round, err)
	}
	defer s2.Close()
	check := func(what, key string) {
		r, err := s2.Get(ctx, []byte(key))
		if err != nil || r.State != idem.StateCompleted || string(r.Result) != "result-"+key {
			t.Fatalf("round %d: %s completion of %q lost in the power cut: %+v %v", round, what, key, r, err)
		}
	}
	for _, k := range acked {
		check("acknowledged", k)
	}
	for k := range observed {
		check("reported", k)
	}
	return len(acked), len(observed)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
