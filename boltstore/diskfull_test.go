//go:build linux

package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// TestDiskFull fills the disk under a store and checks that it fails closed:
// the operation that does not fit fails with idem.ErrUnavailable and leaves
// its record as it was, every acknowledged record stays readable, writes
// resume once space is freed, and the file reopens intact.
//
// Two ways of running out of space: a small tmpfs (real ENOSPC; needs root
// and mount(2), as in the CI container) and RLIMIT_FSIZE (EFBIG, available
// to any user; the limit is the process's, so it is raised again at once).
func TestDiskFull(t *testing.T) {
	t.Run("Tmpfs", func(t *testing.T) {
		dir := t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", dir).CombinedOutput(); err != nil {
			// Not root or no mount(2): the RLIMIT_FSIZE case still runs.
			t.Logf("no tmpfs (%v: %s); covered by RlimitFsize only", err, bytes.TrimSpace(out))
			return
		}
		t.Cleanup(func() {
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", dir, err, out)
			}
		})
		ballast := filepath.Join(dir, "ballast")
		if err := os.WriteFile(ballast, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		diskFull(t, filepath.Join(dir, "idem.db"), syscall.ENOSPC, func() {
			if err := os.Remove(ballast); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("RlimitFsize", func(t *testing.T) {
		var old syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
		restore := func() {
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(restore)
		path := filepath.Join(t.TempDir(), "idem.db")
		diskFull(t, path, syscall.EFBIG, restore, func(size int64) {
			lim := syscall.Rlimit{Cur: uint64(size) + 2<<20, Max: old.Max}
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// diskFull runs the scenario on a store at path. limit, if given, is called
// with the file's size once the store is open, to impose the space limit.
func diskFull(t *testing.T, path string, want syscall.Errno, free func(), limit ...func(size int64)) {
	ctx := context.Background()
	// A small mmap makes bbolt grow the file in small steps instead of
	// 16 MiB ones, so the limit is met after a few MiB of writes.
	s, err := Open(Config{Path: path, SweepInterval: -1, InitialMmapSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(limit) > 0 {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		limit[0](st.Size())
	}
	result := bytes.Repeat([]byte{'r'}, 8<<10)
	var acked []string
	var failErr error
	var failKey string
	var failedComplete bool
	for i := 0; failErr == nil; i++ {
		if i > 100_000 {
			t.Fatal("the disk never filled up")
		}
		key := fmt.Sprintf("key-%06d", i)
		c, err := s.Claim(ctx, claimReq(key))
		if err != nil {
			failErr, failKey = err, key
			break
		}
		if err := s.Complete(ctx, []byte(key), c.Record.Token, result); err != nil {
			failErr, failKey, failedComplete = err, key, true
			break
		}
		acked = append(acked, key)
	}
	t.Logf("after %d acknowledged records: %v", len(acked), failErr)
	if !errors.Is(failErr, idem.ErrUnavailable) || !errors.Is(failErr, want) && !strings.Contains(failErr.Error(), want.Error()) {
		t.Fatalf("want idem.ErrUnavailable and %v, got %v", want, failErr)
	}
	// Nothing half-written: the failed operation left its record as it was.
	r, err := s.Get(ctx, []byte(failKey))
	switch {
	case failedComplete && (err != nil || r.State != idem.StateInProgress):
		t.Fatalf("failed Complete of %s left %+v, %v", failKey, r, err)
	case !failedComplete && !errors.Is(err, idem.ErrNotFound):
		t.Fatalf("failed Claim of %s left %+v, %v", failKey, r, err)
	}
	// Reads keep working.
	for _, key := range acked {
		if r, err := s.Get(ctx, []byte(key)); err != nil || r.State != idem.StateCompleted {
			t.Fatalf("read %s on a full disk: %+v %v", key, r.State, err)
		}
	}
	if st, err := s.Stats(ctx); err != nil || st.Completed != int64(len(acked)) {
		t.Fatalf("stats on a full disk: %+v %v", st, err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("ping on a full disk: %v", err)
	}
	// Space back: writes resume.
	free()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := s.Claim(ctx, claimReq("after"))
		if err == nil {
			if err := s.Complete(ctx, []byte("after"), c.Record.Token, nil); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes did not resume once space was freed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(Config{Path: path, SweepInterval: -1})
	if err != nil {
		t.Fatalf("reopen after disk full: %v", err)
	}
	defer s2.Close()
	for _, key := range append(acked, "after") {
		if r, err := s2.Get(ctx, []byte(key)); err != nil || r.State != idem.StateCompleted {
			t.Fatalf("after reopen %s: %+v %v", key, r.State, err)
		}
	}
}
