package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
)

func newMem(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newGuard(t testing.TB, s idem.Store, opts ...idem.Option) *idem.Guard {
	t.Helper()
	g, err := idem.NewGuard(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

var ctx = context.Background()

func TestDoRunsOnceUnderContention(t *testing.T) {
	g := newGuard(t, newMem(t))
	var runs atomic.Int32
	var wg sync.WaitGroup
	var inProgress, replays atomic.Int32
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := g.Do(ctx, []byte("order-42"), func(ctx context.Context) ([]byte, error) {
				runs.Add(1)
				time.Sleep(5 * time.Millisecond)
				return []byte("charged"), nil
			})
			switch {
			case errors.Is(err, idem.ErrInProgress):
				inProgress.Add(1)
			case err != nil:
				t.Error(err)
			case r.Replayed:
				replays.Add(1)
			}
		}()
	}
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	r, err := g.Do(ctx, []byte("order-42"), func(context.Context) ([]byte, error) {
		t.Fatal("handler ran for a completed key")
		return nil, nil
	})
	if err != nil || !r.Replayed || string(r.Value) != "charged" {
		t.Fatalf("replay = %+v, %v", r, err)
	}
	t.Logf("64 callers: 1 run, %d in progress, %d replays", inProgress.Load(), replays.Load())
}

func TestHandlerErrorReleases(t *testing.T) {
	s := newMem(t)
	g := newGuard(t, s)
	boom := errors.New("downstream 503")
	_, err := g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { return nil, boom })
	var he *idem.HandlerError
	if !errors.As(err, &he) || !errors.Is(err, boom) {
		t.Fatalf("err = %v, want a HandlerError wrapping boom", err)
	}
	rec, _ := s.Get(ctx, []byte("k"))
	if rec.State != idem.StateReleased || rec.LastError != boom.Error() {
		t.Fatalf("record after failure %+v", rec)
	}
	r, err := g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || r.Replayed || r.Attempts != 2 {
		t.Fatalf("retry = %+v, %v", r, err)
	}
}

func TestMaxAttemptsAndPermanent(t *testing.T) {
	s := newMem(t)
	g := newGuard(t, s, idem.WithMaxAttempts(3))
	runs := 0
	fail := func(context.Context) ([]byte, error) { runs++; return nil, errors.New("flaky") }
	for i := 1; i <= 3; i++ {
		_, err := g.Do(ctx, []byte("k"), fail)
		if gotFailed := errors.Is(err, idem.ErrFailed); gotFailed != (i == 3) {
			t.Fatalf("attempt %d: err = %v", i, err)
		}
	}
	_, err := g.Do(ctx, []byte("k"), fail)
	var fe *idem.FailedError
	if !errors.As(err, &fe) || fe.Cause != "flaky" || runs != 3 {
		t.Fatalf("after exhaustion: err = %v, runs = %d", err, runs)
	}

	_, err = g.Do(ctx, []byte("poison"), func(context.Context) ([]byte, error) {
		return nil, idem.Permanent(errors.New("unparseable"))
	})
	if !errors.Is(err, idem.ErrFailed) {
		t.Fatalf("permanent error: %v", err)
	}
	if rec, _ := s.Get(ctx, []byte("poison")); rec.State != idem.StateFailed || rec.Attempts != 1 {
		t.Fatalf("record %+v", rec)
	}
}

// F14: a poison message that crashes the worker each time is stopped once
// its claims exceed the attempt limit, without running it again.
func TestCrashLoopMarkedFailed(t *testing.T) {
	s := newMem(t)
	g := newGuard(t, s, idem.WithMaxAttempts(2), idem.WithLease(20*time.Millisecond), idem.WithHeartbeat(-1))
	for i := 0; i < 2; i++ {
		h, _, err := g.Acquire(ctx, []byte("k"))
		if err != nil || h == nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		time.Sleep(30 * time.Millisecond) // the worker "crashes": never settles
	}
	_, err := g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) {
		t.Fatal("ran a message that crashed every attempt")
		return nil, nil
	})
	if !errors.Is(err, idem.ErrFailed) {
		t.Fatalf("err = %v, want ErrFailed", err)
	}
}

func TestInProgressAndFingerprint(t *testing.T) {
	g := newGuard(t, newMem(t))
	h, _, err := g.Acquire(ctx, []byte("k"), idem.WithFingerprint(idem.FingerprintOf([]byte("payload-1"))))
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { return nil, nil })
	var ip *idem.InProgressError
	if !errors.As(err, &ip) || ip.RetryAfter(time.Now()) <= 0 {
		t.Fatalf("err = %v, want InProgressError with a retry hint", err)
	}
	_, err = g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { return nil, nil },
		idem.WithFingerprint(idem.FingerprintOf([]byte("payload-2"))))
	if !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("err = %v, want ErrFingerprintMismatch", err)
	}
	if err := h.Complete(ctx, []byte("done")); err != nil {
		t.Fatal(err)
	}
}

func TestFailClosedAndFailOpen(t *testing.T) {
	fs := faultstore.New(newMem(t))
	fs.SetDown(true)
	ran := false
	fn := func(context.Context) ([]byte, error) { ran = true; return nil, nil }
	_, err := newGuard(t, fs).Do(ctx, []byte("k"), fn)
	if !errors.Is(err, idem.ErrUnavailable) || ran {
		t.Fatalf("fail closed: err = %v, ran = %v", err, ran)
	}
	var opened countHook
	r, err := newGuard(t, fs, idem.WithFailOpen(true), idem.WithHooks(opened.hooks())).Do(ctx, []byte("k"), fn)
	if err != nil || !r.FailedOpen || !ran || opened.failOpen.Load() != 1 {
		t.Fatalf("fail open: %+v, %v, ran=%v, hook=%d", r, err, ran, opened.failOpen.Load())
	}
}

type countHook struct {
	claims, settles, failOpen, lost atomic.Int32
	mu                              sync.Mutex
	outcomes                        []idem.Outcome
	actions                         []idem.SettleAction
	unrecorded                      []idem.UnrecordedEvent
}

// hooks returns the Hooks that feed h.
func (h *countHook) hooks() idem.Hooks {
	return idem.Hooks{
		OnClaim: func(_ context.Context, e idem.ClaimEvent) {
			h.claims.Add(1)
			h.mu.Lock()
			h.outcomes = append(h.outcomes, e.Outcome)
			h.mu.Unlock()
		},
		OnSettle: func(_ context.Context, e idem.SettleEvent) {
			h.settles.Add(1)
			h.mu.Lock()
			h.actions = append(h.actions, e.Action)
			h.mu.Unlock()
		},
		OnFailOpen:  func(context.Context, []byte, error) { h.failOpen.Add(1) },
		OnLeaseLost: func(context.Context, []byte, uint64, error) { h.lost.Add(1) },
		OnUnrecorded: func(_ context.Context, e idem.UnrecordedEvent) {
			h.mu.Lock()
			h.unrecorded = append(h.unrecorded, e)
			h.mu.Unlock()
		},
	}
}

func TestHooks(t *testing.T) {
	var h countHook
	g := newGuard(t, newMem(t), idem.WithHooks(h.hooks()))
	g.Do(ctx, []byte("a"), func(context.Context) ([]byte, error) { return nil, nil })
	g.Do(ctx, []byte("a"), func(context.Context) ([]byte, error) { return nil, nil })
	g.Do(ctx, []byte("b"), func(context.Context) ([]byte, error) { return nil, errors.New("x") })
	want := []idem.Outcome{idem.OutcomeAcquired, idem.OutcomeCompleted, idem.OutcomeAcquired}
	if len(h.outcomes) != 3 || h.outcomes[0] != want[0] || h.outcomes[1] != want[1] || h.outcomes[2] != want[2] {
		t.Fatalf("claim outcomes %v, want %v", h.outcomes, want)
	}
	if len(h.actions) != 2 || h.actions[0] != idem.SettleComplete || h.actions[1] != idem.SettleRelease {
		t.Fatalf("settle actions %v", h.actions)
	}
}

// The heartbeat keeps a handler's lease alive past several leases. On a
// manual clock (see stepHeld): the lease lapses only if no heartbeat comes,
// however slow the machine is.
func TestHeartbeatKeepsLease(t *testing.T) {
	clk := newManualClock()
	mem := newMemClock(t, clk)
	fs := faultstore.New(mem)
	const lease = time.Second
	g := newGuard(t, fs, idem.WithLease(lease), idem.WithClock(clk))
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := g.Do(ctx, []byte("slow"), func(context.Context) ([]byte, error) {
			close(started)
			<-finish
			return []byte("ok"), nil
		})
		done <- err
	}()
	<-started
	stepHeld(t, clk, mem, []string{"slow"}, 400*time.Millisecond, 8, nil, func(int) {
		if _, err := g.Do(ctx, []byte("slow"), func(context.Context) ([]byte, error) {
			return nil, errors.New("a second worker ran while the first held the key")
		}); !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("while held: %v", err)
		}
	})
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if fs.Calls(faultstore.OpExtend) == 0 {
		t.Fatal("no heartbeat extended the lease")
	}
}

func TestLeaseLostCancelsHandler(t *testing.T) {
	s := newMem(t)
	var hook countHook
	g := newGuard(t, s, idem.WithLease(60*time.Millisecond), idem.WithHooks(hook.hooks()))
	var cause error
	_, err := g.Do(ctx, []byte("k"), func(ctx context.Context) ([]byte, error) {
		if tok, ok := idem.TokenFromContext(ctx); !ok || tok == 0 {
			t.Error("no token in the handler's context")
		}
		s.Delete(context.Background(), []byte("k")) // an operator evicts the record
		<-ctx.Done()
		cause = context.Cause(ctx)
		return nil, ctx.Err()
	})
	if !errors.Is(cause, idem.ErrLeaseLost) || err == nil || hook.lost.Load() == 0 {
		t.Fatalf("cause = %v, err = %v, lost hooks = %d", cause, err, hook.lost.Load())
	}
}

// F4/F17: a Complete whose answer is lost is resolved by reading the record.
func TestCompleteUnknownOutcome(t *testing.T) {
	fs := faultstore.New(newMem(t))
	g := newGuard(t, fs)
	fs.Inject(faultstore.OpComplete, faultstore.Fault{Err: idem.ErrUnknownOutcome, Applied: true, Times: 1})
	if _, err := g.Do(ctx, []byte("applied"), func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil {
		t.Fatalf("applied-but-lost complete: %v", err)
	}
	fs.Inject(faultstore.OpComplete, faultstore.Fault{Times: 2})
	if _, err := g.Do(ctx, []byte("transient"), func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil {
		t.Fatalf("transient complete failure: %v", err)
	}
	if rec, _ := fs.Get(ctx, []byte("transient")); rec.State != idem.StateCompleted {
		t.Fatalf("record %+v", rec)
	}
	fs.Inject(faultstore.OpComplete, faultstore.Fault{})
	_, err := newGuard(t, fs, idem.WithCompleteRetries(2)).Do(ctx, []byte("down"), func(context.Context) ([]byte, error) { return nil, nil })
	if !errors.Is(err, idem.ErrUnrecorded) {
		t.Fatalf("err = %v, want ErrUnrecorded", err)
	}
}

// A panicking handler is an error of that call (the stack logged), never
// a crash of the process: Do releases the key and returns a *HandlerError
// matching ErrPanicked.
func TestPanicReleasesAndReturnsError(t *testing.T) {
	s := newMem(t)
	var logs syncBuf
	g := newGuard(t, s, idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Do let the handler's panic through: %v", r)
			}
		}()
		_, err = g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { panic("bug") })
	}()
	var he *idem.HandlerError
	if !errors.As(err, &he) || !errors.Is(err, idem.ErrPanicked) || !strings.Contains(err.Error(), "bug") {
		t.Fatalf("err = %v, want a *HandlerError matching ErrPanicked", err)
	}
	if rec, _ := s.Get(ctx, []byte("k")); rec.State != idem.StateReleased || !strings.Contains(rec.LastError, "panic") {
		t.Fatalf("record after panic %+v", rec)
	}
	if out := logs.String(); !strings.Contains(out, "guard_test.go") {
		t.Fatalf("the panic's stack was not logged:\n%s", out)
	}
}

func TestSettleSurvivesCancelledContext(t *testing.T) {
	s := newMem(t)
	g := newGuard(t, s)
	cctx, cancel := context.WithCancel(ctx)
	_, err := g.Do(cctx, []byte("k"), func(context.Context) ([]byte, error) {
		cancel() // shutdown arrives after the effect is done
		return []byte("v"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Get(ctx, []byte("k")); rec.State != idem.StateCompleted {
		t.Fatalf("record %+v", rec)
	}
}

type noBatch struct{ idem.Store }

// batchWraps are the two ways AcquireBatch serves a store: with its
// BatchClaimer, and one Acquire per key when it has none.
var batchWraps = []struct {
	name string
	wrap func(idem.Store) idem.Store
}{
	{"batch store", func(s idem.Store) idem.Store { return s }},
	{"one by one", func(s idem.Store) idem.Store { return noBatch{s} }},
}

func TestAcquireBatch(t *testing.T) {
	for _, tc := range batchWraps {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, tc.wrap(newMem(t)))
			g.Do(ctx, []byte("done"), func(context.Context) ([]byte, error) { return []byte("r"), nil })
			acq, err := g.AcquireBatch(ctx, []idem.BatchItem{{Key: []byte("a")}, {Key: []byte("done")}, {Key: []byte("a")}, {Key: nil}})
			if err != nil {
				t.Fatal(err)
			}
			if acq[0].Held == nil || acq[0].Err != nil {
				t.Fatalf("new key: %+v", acq[0])
			}
			if !acq[1].Result.Replayed || string(acq[1].Result.Value) != "r" {
				t.Fatalf("completed key: %+v", acq[1])
			}
			if !errors.Is(acq[2].Err, idem.ErrInProgress) || !errors.Is(acq[3].Err, idem.ErrInvalidKey) {
				t.Fatalf("dup / invalid: %v / %v", acq[2].Err, acq[3].Err)
			}
			if err := acq[0].Held.Complete(ctx, []byte("x")); err != nil {
				t.Fatal(err)
			}
		})
	}
	fs := faultstore.New(newMem(t))
	fs.Inject(faultstore.OpBatch, faultstore.Fault{})
	if _, err := newGuard(t, fs.WithBatch()).AcquireBatch(ctx, []idem.BatchItem{{Key: []byte("a")}}); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("batch with store down: %v", err)
	}
}

// AcquireBatchInto answers as AcquireBatch into the caller's slice: every
// entry written (stale ones from an earlier batch replaced), one entry
// per item, and nothing once the guard is closed.
func TestAcquireBatchInto(t *testing.T) {
	for _, tc := range batchWraps {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, tc.wrap(newMem(t)))
			g.Do(ctx, []byte("done"), func(context.Context) ([]byte, error) { return []byte("r"), nil })
			items := []idem.BatchItem{{Key: []byte("a")}, {Key: []byte("done")}, {Key: []byte("a")}}
			stale, _, err := g.Acquire(ctx, []byte("stale"))
			if err != nil {
				t.Fatal(err)
			}
			out := make([]idem.Acquisition, len(items))
			for i := range out {
				out[i] = idem.Acquisition{Held: stale, Result: idem.Result{Value: []byte("old"), Replayed: true}, Err: errors.New("old")}
			}
			if err := g.AcquireBatchInto(ctx, items, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Held == nil || out[0].Held == stale || out[0].Err != nil || out[0].Result.Replayed {
				t.Fatalf("new key: %+v", out[0])
			}
			if out[1].Held != nil || out[1].Err != nil || !out[1].Result.Replayed || string(out[1].Result.Value) != "r" {
				t.Fatalf("completed key: %+v", out[1])
			}
			if out[2].Held != nil || !errors.Is(out[2].Err, idem.ErrInProgress) || out[2].Result.Replayed {
				t.Fatalf("same key again: %+v", out[2])
			}
			if err := g.AcquireBatchInto(ctx, items, out[:2]); !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("2 results for 3 items: %v, want ErrInvalidArgument", err)
			}
			for _, h := range []*idem.Held{out[0].Held, stale} {
				if err := h.Complete(ctx, nil); err != nil {
					t.Fatal(err)
				}
			}
			g.Close()
			if err := g.AcquireBatchInto(ctx, items, out); !errors.Is(err, idem.ErrClosed) {
				t.Fatalf("closed guard: %v, want ErrClosed", err)
			}
		})
	}
}

func TestGuardOptions(t *testing.T) {
	s := newMem(t)
	for _, tc := range []struct {
		name string
		opt  idem.Option
	}{
		{"zero lease", idem.WithLease(0)},
		{"absurd ttl", idem.WithTTL(idem.MaxTTL + time.Hour)},
		{"negative attempts", idem.WithMaxAttempts(-1)},
		{"heartbeat not shorter than lease", idem.WithHeartbeat(time.Hour)},
		{"negative complete retries", idem.WithCompleteRetries(-1)},
	} {
		if _, err := idem.NewGuard(s, tc.opt); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
	}
	if _, err := idem.NewGuard(nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("nil store: %v", err)
	}
	g := newGuard(t, s, idem.WithTTL(time.Hour))
	if err := g.CheckRedeliveryWindow(2 * time.Hour); err == nil {
		t.Error("TTL shorter than the redelivery window was not reported")
	}
	if err := g.CheckRedeliveryWindow(time.Hour); err != nil {
		t.Error(err)
	}
}

// Many claims held at once, some lost, some settled while their heartbeat
// runs: exercises the shared heartbeat loop under the race detector. The
// heartbeat beats every 5 ms, but the lease is a minute: no stall of a
// loaded machine lets a lease or a settle window run out, and a claim is
// lost only because its record was deleted.
func TestHeartbeatManyHeld(t *testing.T) {
	s := newMem(t)
	g := newGuard(t, s, idem.WithLease(time.Minute), idem.WithHeartbeat(5*time.Millisecond))
	defer g.Close()
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte{byte(i), byte(i >> 8)}
			_, err := g.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
				if i%10 == 0 {
					s.Delete(context.Background(), key)
					<-ctx.Done()
					return nil, ctx.Err()
				}
				time.Sleep(time.Duration(i%7) * 10 * time.Millisecond)
				return nil, nil
			})
			if (i%10 == 0) != (err != nil) {
				t.Errorf("key %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	st, _ := s.Stats(ctx)
	if st.Completed != 180 || st.InProgress != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCompleteBatch(t *testing.T) {
	acquire := func(t *testing.T, g *idem.Guard, keys ...string) []*idem.Held {
		var hs []*idem.Held
		for _, k := range keys {
			var opts []idem.CallOption
			if k == "c" {
				opts = append(opts, idem.WithCallLease(50*time.Millisecond))
			}
			h, _, err := g.Acquire(ctx, []byte(k), opts...)
			if err != nil || h == nil {
				t.Fatalf("acquire %q: %v", k, err)
			}
			hs = append(hs, h)
		}
		return hs
	}
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) (idem.Store, *faultstore.Store)
	}{
		{"batch store", func(t *testing.T) (idem.Store, *faultstore.Store) {
			fs := faultstore.New(newMem(t))
			return fs.WithBatch(), fs
		}},
		{"one by one", func(t *testing.T) (idem.Store, *faultstore.Store) {
			fs := faultstore.New(newMem(t))
			return noBatch{fs}, fs
		}},
		{"batch call fails, entries retried", func(t *testing.T) (idem.Store, *faultstore.Store) {
			fs := faultstore.New(newMem(t))
			fs.Inject(faultstore.OpCompleteBatch, faultstore.Fault{Err: idem.ErrUnknownOutcome, Applied: true, Times: 1})
			return fs.WithBatch(), fs
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, fs := tc.store(t)
			g := newGuard(t, st, idem.WithHeartbeat(-1))
			hs := acquire(t, g, "a", "b", "c")
			// "c" (a 50 ms lease) stalls past its lease and is taken over.
			time.Sleep(60 * time.Millisecond)
			g2 := newGuard(t, st)
			if h, _, err := g2.Acquire(ctx, []byte("c")); err != nil || h == nil {
				t.Fatalf("takeover: %v", err)
			}
			errs := g.CompleteBatch(ctx, hs, [][]byte{[]byte("ra"), []byte("rb"), []byte("rc")})
			if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], idem.ErrFenced) {
				t.Fatalf("errs = %v", errs)
			}
			for _, k := range []string{"a", "b"} {
				if r, err := fs.Get(ctx, []byte(k)); err != nil || r.State != idem.StateCompleted || string(r.Result) != "r"+k {
					t.Fatalf("%s: %+v %v", k, r, err)
				}
			}
			if _, isBatch := st.(idem.BatchCompleter); isBatch && fs.Calls(faultstore.OpCompleteBatch) != 1 {
				t.Fatalf("%d batch calls, want 1", fs.Calls(faultstore.OpCompleteBatch))
			}
		})
	}
	g := newGuard(t, newMem(t))
	hs := acquire(t, g, "x")
	if errs := g.CompleteBatch(ctx, hs, [][]byte{nil, nil}); !errors.Is(errs[0], idem.ErrInvalidArgument) {
		t.Fatalf("mismatched results: %v", errs)
	}
	if errs := g.CompleteBatch(ctx, hs, nil); errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// Several Hooks values all see each event; nil fields are skipped.
func TestHooksSeveralAndNilFields(t *testing.T) {
	var a, b countHook
	only := a.hooks()
	only.OnSettle = nil // a is told about claims only
	g := newGuard(t, newMem(t), idem.WithHooks(only), idem.WithHooks(b.hooks(), idem.Hooks{}))
	if _, err := g.Do(ctx, []byte("k"), func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if a.claims.Load() != 1 || b.claims.Load() != 1 || a.settles.Load() != 0 || b.settles.Load() != 1 {
		t.Fatalf("claims %d/%d settles %d/%d, want 1/1 0/1", a.claims.Load(), b.claims.Load(), a.settles.Load(), b.settles.Load())
	}
}

// TestClaimCompletedByItsOwnTransactionIsNotLost: the handler's effect
// completes the claim itself with the claim's token (pgstore's DoTx under
// the consumer runtime's claim does, in the effect's transaction). The
// heartbeat's next Extend is then fenced; that is the claim done, not
// lost: no cancellation, no OnLeaseLost, and the guard's own Complete
// afterwards is the idempotent repeat.
func TestClaimCompletedByItsOwnTransactionIsNotLost(t *testing.T) {
	s := newMem(t)
	fs := faultstore.New(s)
	var hook countHook
	g := newGuard(t, fs, idem.WithLease(90*time.Millisecond), idem.WithHooks(hook.hooks()))
	var cause error
	res, err := g.Do(ctx, []byte("k"), func(ctx context.Context) ([]byte, error) {
		tok, _ := idem.TokenFromContext(ctx)
		if err := s.Complete(ctx, []byte("k"), tok, []byte("tx")); err != nil {
			return nil, err
		}
		// Let the heartbeat find the record completed, and give a loss
		// time to show (on memstore a beat takes microseconds).
		for n, deadline := fs.Calls(faultstore.OpExtend), time.Now().Add(10*time.Second); fs.Calls(faultstore.OpExtend) <= n; {
			if time.Now().After(deadline) {
				t.Fatal("no heartbeat within 10s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
		case <-time.After(300 * time.Millisecond):
		}
		cause = context.Cause(ctx)
		return []byte("tx"), nil
	})
	if err != nil || cause != nil || hook.lost.Load() != 0 {
		t.Fatalf("Do = %v, handler's context cause %v, OnLeaseLost %d; want nil, nil, 0", err, cause, hook.lost.Load())
	}
	rec, err := s.Get(ctx, []byte("k"))
	if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "tx" || res.Replayed {
		t.Fatalf("record %+v, %v; result %+v", rec, err, res)
	}
}

// lateDoneStore calls ctx.Done from a goroutine of its own after Complete
// returned, as database/sql's Rows does for a query it has finished
// (awaitDone starts late): the settle round's context must stay safe to
// use after the round.
type lateDoneStore struct {
	idem.Store
	wg sync.WaitGroup
}

func (s *lateDoneStore) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	err := s.Store.Complete(ctx, key, token, result)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = ctx.Done()
		_, _ = ctx.Deadline()
		_ = ctx.Err()
	}()
	return err
}

// TestSettleContextUsedAfterTheRound: the race detector found the guard
// rewriting a settle round's context while a driver goroutine still read
// it (mysqlstore's Complete of a record already completed reads it back
// with QueryRowContext).
func TestSettleContextUsedAfterTheRound(t *testing.T) {
	s := &lateDoneStore{Store: newMem(t)}
	g := newGuard(t, s)
	for i := range 200 {
		if _, err := g.Do(ctx, []byte{byte(i)}, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	s.wg.Wait()
}

// ContextWithHeld gives code that runs an effect under a claim from Acquire
// the token TokenFromContext gives inside Do; no claim, no token.
func TestContextWithHeld(t *testing.T) {
	g := newGuard(t, newMem(t))
	h, _, err := g.Acquire(ctx, []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	if tok, ok := idem.TokenFromContext(idem.ContextWithHeld(ctx, h)); !ok || tok != h.Token() {
		t.Fatalf("TokenFromContext = %d, %v; want %d", tok, ok, h.Token())
	}
	if _, ok := idem.TokenFromContext(idem.ContextWithHeld(ctx, nil)); ok {
		t.Fatal("a token without a claim")
	}
	// The innermost claim wins: Do's handler running under another claim's
	// context reports its own ("other" was claimed and released once
	// before: the next token of its shard; h's may come from the same
	// shard, so no number is assumed).
	prev, _, err := g.Acquire(ctx, []byte("other"))
	if err != nil {
		t.Fatal(err)
	}
	prev.Release(ctx, errors.New("again"))
	if _, err := g.Do(idem.ContextWithHeld(ctx, h), []byte("other"), func(ctx context.Context) ([]byte, error) {
		if tok, _ := idem.TokenFromContext(ctx); tok != prev.Token()+1 || tok == h.Token() {
			t.Errorf("inside Do: token %d, want %d (h's is %d)", tok, prev.Token()+1, h.Token())
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	open := newGuard(t, faultstore.New(newMem(t)), idem.WithFailOpen(true))
	open.Store().(*faultstore.Store).Inject(faultstore.OpClaim, faultstore.Fault{Err: idem.ErrUnavailable})
	oh, res, err := open.Acquire(ctx, []byte("k"))
	if err != nil || !res.FailedOpen {
		t.Fatalf("fail-open acquire: %+v, %v", res, err)
	}
	if _, ok := idem.TokenFromContext(idem.ContextWithHeld(ctx, oh)); ok {
		t.Fatal("a token under fail-open (no claim)")
	}
	h.Complete(ctx, nil)
}
