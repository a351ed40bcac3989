package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
)

// syncBuf is a bytes.Buffer safe for a logger used from several goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// With background retry off, an unrecorded completion is abandoned at
// once: the log must not promise a background retry that never happens.
func TestUnrecordedLogWithoutBackgroundRetry(t *testing.T) {
	fs := faultstore.New(newMem(t))
	var logs syncBuf
	g := newGuard(t, fs, idem.WithLease(100*time.Millisecond), idem.WithBackgroundRetry(-1),
		idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	fs.Inject(faultstore.OpComplete, faultstore.Fault{})
	if _, err := g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrUnrecorded) {
		t.Fatalf("err = %v, want ErrUnrecorded", err)
	}
	if out := logs.String(); strings.Contains(out, "background") && !strings.Contains(out, "background retry is off") {
		t.Fatalf("log promises a background retry that is off:\n%s", out)
	}
}

// The holder's lease end comes from the store's clock and RetryAfter
// measures it against the local one: a skew between them must give
// neither a negative wait nor one longer than the lease (a consumer would
// nak the message for ten hours).
func TestRetryAfterRobustToClockSkew(t *testing.T) {
	const lease = 2 * time.Second
	for _, skew := range []time.Duration{10 * time.Hour, -10 * time.Hour, 0} {
		t.Run(skew.String(), func(t *testing.T) {
			clk := newManualClock()
			clk.Advance(-time.Until(clk.Now()) + skew) // the store's clock: skew ahead of ours
			s := newMemClock(t, clk)
			g := newGuard(t, s, idem.WithLease(lease))
			h, _, err := g.Acquire(ctx, []byte("k"))
			if err != nil || h == nil {
				t.Fatalf("acquire: %v", err)
			}
			defer h.Release(ctx, nil)
			_, _, err = g.Acquire(ctx, []byte("k"))
			var ip *idem.InProgressError
			if !errors.As(err, &ip) {
				t.Fatalf("err = %v, want *InProgressError", err)
			}
			if d := ip.RetryAfter(time.Now()); d <= 0 || d > lease {
				t.Fatalf("RetryAfter = %s with the store's clock %s off ours, want within (0, %s]", d, skew, lease)
			}
		})
	}
}

// After Close the guard takes no new claim (ErrClosed: its heartbeat and
// background completer are stopped, so a claim would be held unextended),
// while a claim taken before settles as usual.
func TestClosedGuardRefusesNewClaims(t *testing.T) {
	s := newMem(t)
	g, err := idem.NewGuard(s)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := g.Acquire(ctx, []byte("before"))
	if err != nil || h == nil {
		t.Fatalf("acquire: %v", err)
	}
	g.Close()
	ran := false
	if _, err := g.Do(ctx, []byte("after"), func(context.Context) ([]byte, error) { ran = true; return nil, nil }); !errors.Is(err, idem.ErrClosed) || ran {
		t.Fatalf("Do after Close: err = %v, ran %v; want ErrClosed, not run", err, ran)
	}
	if h, _, err := g.Acquire(ctx, []byte("after")); !errors.Is(err, idem.ErrClosed) || h != nil {
		t.Fatalf("Acquire after Close: err = %v", err)
	}
	if acqs, err := g.AcquireBatch(ctx, []idem.BatchItem{{Key: []byte("after")}}); !errors.Is(err, idem.ErrClosed) || acqs != nil {
		t.Fatalf("AcquireBatch after Close: %+v, %v", acqs, err)
	}
	if _, err := s.Get(ctx, []byte("after")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("a claim reached the store after Close: %v", err)
	}
	if err := h.Complete(ctx, []byte("v")); err != nil {
		t.Fatalf("completing a claim taken before Close: %v", err)
	}
	if r, err := s.Get(ctx, []byte("before")); err != nil || r.State != idem.StateCompleted {
		t.Fatalf("record %+v, %v", r, err)
	}
}

// Renew extends a held claim now, with its token, and says whether it is
// still ours: code that kept a claim across a wait (the consumer runtime
// holding a message) must not run the effect again under a claim another
// process took over while its heartbeats failed.
func TestRenewVerifiesKeptClaim(t *testing.T) {
	clk := newManualClock()
	mem := newMemClock(t, clk)
	fs := faultstore.New(mem)
	const lease = time.Second
	g := newGuard(t, fs, idem.WithLease(lease), idem.WithClock(clk))
	rival := newGuard(t, mem, idem.WithLease(lease), idem.WithClock(clk))
	h, _, err := g.Acquire(ctx, []byte("k"))
	if err != nil || h == nil {
		t.Fatalf("acquire: %v", err)
	}
	before, _ := mem.Get(ctx, []byte("k"))
	clk.Advance(lease / 2)
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("renew of a live claim: %v", err)
	}
	if r, _ := mem.Get(ctx, []byte("k")); !r.LeaseUntil.After(before.LeaseUntil) {
		t.Fatalf("renew did not extend the lease: %s, before %s", r.LeaseUntil, before.LeaseUntil)
	}
	// The claim's heartbeats fail (the store unreachable from here only)
	// past its lease, and a rival takes the key over.
	fs.Inject(faultstore.OpExtend, faultstore.Fault{})
	if err := h.Renew(ctx); !errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("renew with the store unreachable: %v, want ErrUnavailable, not lost", err)
	}
	clk.Advance(2 * lease)
	if _, err := rival.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatalf("rival: %v", err)
	}
	fs.Clear()
	if err := h.Renew(ctx); !errors.Is(err, idem.ErrLeaseLost) || !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("renew of a claim taken over: %v, want ErrLeaseLost and ErrFenced", err)
	}
	select {
	case <-h.Done():
	default:
		t.Fatal("Done not closed after Renew found the claim lost")
	}
	if err := h.Release(ctx, nil); !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("release after loss: %v", err)
	}
}

// Hooks run inline on the caller's goroutine, the heartbeat's or the
// background completer's: a panicking hook is logged and ignored, never a
// crash of the process nor a claim left held.
func TestPanickingHooksIgnored(t *testing.T) {
	clk := newManualClock()
	mem := newMemClock(t, clk)
	fs := faultstore.New(mem)
	boom := func() { panic("hook bug") }
	var lost sync.WaitGroup
	lost.Add(1)
	hooks := idem.Hooks{
		OnClaim:      func(context.Context, idem.ClaimEvent) { boom() },
		OnSettle:     func(context.Context, idem.SettleEvent) { boom() },
		OnFailOpen:   func(context.Context, []byte, error) { boom() },
		OnLeaseLost:  func(context.Context, []byte, uint64, error) { defer lost.Done(); boom() },
		OnUnrecorded: func(context.Context, idem.UnrecordedEvent) { boom() },
	}
	var logs syncBuf
	const lease = time.Second
	g := newGuard(t, fs, idem.WithLease(lease), idem.WithClock(clk), idem.WithHooks(hooks), idem.WithFailOpen(true),
		idem.WithCompleteRetries(2), idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("a hook's panic reached the caller: %v", r)
			}
		}()
		if _, err := g.Do(ctx, []byte("a"), func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil {
			t.Fatalf("Do: %v", err)
		}
		// Fail-open: OnFailOpen.
		fs.Inject(faultstore.OpClaim, faultstore.Fault{Times: 1})
		if res, err := g.Do(ctx, []byte("o"), func(context.Context) ([]byte, error) { return nil, nil }); err != nil || !res.FailedOpen {
			t.Fatalf("fail-open Do: %+v, %v", res, err)
		}
		// Unrecorded (3 tries, then the background): OnUnrecorded from
		// the caller, then from the background completer.
		fs.Inject(faultstore.OpComplete, faultstore.Fault{Times: 5})
		if _, err := g.Do(ctx, []byte("u"), func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrUnrecorded) {
			t.Fatalf("Do: %v, want ErrUnrecorded", err)
		}
	}()
	if r, err := mem.Get(ctx, []byte("a")); err != nil || r.State != idem.StateCompleted {
		t.Fatalf("record %+v, %v", r, err)
	}
	// A claim lost while held: OnLeaseLost from the heartbeat goroutine.
	h, _, err := g.Acquire(ctx, []byte("l"))
	if err != nil || h == nil {
		t.Fatalf("acquire: %v", err)
	}
	if err := mem.Delete(ctx, []byte("l")); err != nil {
		t.Fatal(err)
	}
	clk.Advance(lease / 2)
	lost.Wait() // the process is still alive after the hook panicked
	<-h.Done()
	waitUntil(t, "the background to record u", func() bool {
		r, err := mem.Get(ctx, []byte("u"))
		return err == nil && r.State == idem.StateCompleted
	})
	out := logs.String()
	for _, hook := range []string{"OnClaim", "OnSettle", "OnFailOpen", "OnLeaseLost", "OnUnrecorded"} {
		if !strings.Contains(out, "hook="+hook) {
			t.Errorf("no panic of %s logged", hook)
		}
	}
	if !strings.Contains(out, "hook bug") {
		t.Fatalf("the hooks' panics were not logged:\n%s", out)
	}
}
