package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

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
