package remotestore

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
	"github.com/idem-dev/idem/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t testing.TB, st idem.Store) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = Serve(ln, st) })
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// TestConformance: the embedded store behind the harness's store server
// keeps the whole store contract (storetest), so the harness's bolt runs
// test boltstore and not a looser copy of it.
func TestConformance(t *testing.T) {
	root, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "idem.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	storetest.Run(t, func(t testing.TB, ns string) idem.Store {
		s, err := root.Namespace(ns)
		if err != nil {
			t.Fatal(err)
		}
		c := Dial(serve(t, s), 10*time.Second)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c
	}, storetest.Features{LeaseUnit: 200 * time.Millisecond})
}

// TestErrorsOnTheWire: nothing listening is ErrUnavailable (the call was
// never sent); a server that dies holding the call, or answers after the
// deadline, is ErrUnknownOutcome; store errors come back as idem's
// sentinels.
func TestErrorsOnTheWire(t *testing.T) {
	ctx := context.Background()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c := Dial(addr, time.Second)
	if _, err := c.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), Lease: time.Second, TTL: time.Minute}); !errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("refused: %v, want ErrUnavailable only", err)
	}
	c.Close()

	// A server that reads the call and hangs up.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 64)
		_, _ = conn.Read(buf)
		conn.Close()
	})
	c = Dial(ln.Addr().String(), 5*time.Second)
	err = c.Complete(ctx, []byte("k"), 1, nil)
	if !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("hung up mid-call: %v, want ErrUnknownOutcome", err)
	}
	c.Close()
	ln.Close()
	wg.Wait()

	// A server that never answers: the deadline makes it unknown.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 1)
	wg.Go(func() {
		conn, err := ln.Accept()
		if err == nil {
			held <- conn
		}
	})
	c = Dial(ln.Addr().String(), 200*time.Millisecond)
	if err := c.Extend(ctx, []byte("k"), 1, time.Second); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("no answer: %v, want ErrUnknownOutcome", err)
	}
	c.Close()
	ln.Close()
	wg.Wait()
	(<-held).Close()

	// Sentinels round-trip.
	st, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "s.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c = Dial(serve(t, st), time.Second)
	defer c.Close()
	cl, err := c.Claim(ctx, idem.ClaimRequest{Key: []byte("s"), Fingerprint: []byte("a"), Lease: time.Minute, TTL: time.Hour})
	if err != nil || cl.Outcome != idem.OutcomeAcquired {
		t.Fatalf("claim: %+v %v", cl, err)
	}
	if _, err := c.Claim(ctx, idem.ClaimRequest{Key: []byte("s"), Fingerprint: []byte("b"), Lease: time.Minute, TTL: time.Hour}); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	if err := c.Complete(ctx, []byte("s"), cl.Record.Token+1, nil); !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("fenced: %v", err)
	}
	if _, err := c.Get(ctx, []byte("absent")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("not found: %v", err)
	}
	if err := c.ClassifyError(errors.New("x")); errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("classify: %v", err)
	}
}
