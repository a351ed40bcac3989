package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

func TestCompact(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "a.db"), filepath.Join(dir, "b.db")
	s, err := Open(Config{Path: src, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]idem.ClaimRequest, 2000)
	for i := range reqs {
		reqs[i] = claimReq(fmt.Sprint("key-", i))
		if i%10 != 0 {
			reqs[i].TTL = time.Millisecond
			reqs[i].Lease = time.Millisecond
		}
	}
	if _, err := s.ClaimBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if n, err := s.Purge(ctx, 0); err != nil || n != 1800 {
		t.Fatalf("purge: %d %v", n, err)
	}
	if err := Compact(src, dst, 50*time.Millisecond); !errors.Is(err, ErrInUse) {
		t.Fatalf("compact of an open store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Compact(src, dst, time.Second); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(src)
	b, _ := os.Stat(dst)
	t.Logf("%d bytes -> %d bytes", a.Size(), b.Size())
	c, err := Open(Config{Path: dst})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st, err := c.Stats(ctx); err != nil || st.InProgress != 200 {
		t.Fatalf("stats after compact: %+v %v", st, err)
	}
	if r, err := c.Claim(ctx, claimReq("fresh")); err != nil || r.Record.Token <= 2000 {
		t.Fatalf("token after compact: %+v %v", r, err)
	}
}
