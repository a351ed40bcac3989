package brokertest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
)

// FreePort returns a loopback TCP port nothing listens on (yet), for a test
// that starts its broker late on it.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// NotReady checks that r is not ready within wait: WaitReady returns the
// deadline's error. It returns that error (which should say why).
func NotReady(t testing.TB, r broker.Readier, wait time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	err := r.WaitReady(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady of a subscriber that cannot be ready = %v, want the context's deadline", err)
	}
	return err
}

// ReadyThenClosed checks the broker.Readier contract on a ready r: nil at
// once even with a done context; closed, broker.ErrClosed.
func ReadyThenClosed(t testing.TB, r broker.Readier, closer interface{ Close() error }) {
	t.Helper()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.WaitReady(done); err != nil {
		t.Fatalf("WaitReady once ready, with a done context: %v", err)
	}
	if err := closer.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReady(context.Background()); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("WaitReady after Close = %v, want broker.ErrClosed", err)
	}
}
