package promidem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newCollector(t *testing.T, cfg promidem.Config) (*promidem.Collector, *prometheus.Registry) {
	t.Helper()
	col, err := promidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(col); err != nil {
		t.Fatal(err)
	}
	return col, reg
}

func nop(context.Context) ([]byte, error) { return []byte("ok"), nil }

// TestGuardHooksCountEveryOutcome drives a guard through each claim
// outcome, a takeover after a lapsed lease, a fenced settle by the stale
// holder, a release, a store outage (fail closed), an unrecorded
// completion and a fail-open pass, and reads each one back from the
// registry under its documented name and labels.
func TestGuardHooksCountEveryOutcome(t *testing.T) {
	ctx := context.Background()
	col, reg := newCollector(t, promidem.Config{Namespace: "orders"})
	clk := newClock()
	ms, err := memstore.New(memstore.Config{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	fs := faultstore.New(ms)
	g, err := idem.NewGuard(fs, idem.WithHooks(col.GuardHooks()), idem.WithLease(time.Minute),
		idem.WithHeartbeat(-1), idem.WithCompleteRetries(1), idem.WithBackgroundRetry(-1), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	if _, err := g.Do(ctx, []byte("k1"), nop); err != nil { // acquired, completed
		t.Fatal(err)
	}
	if r, err := g.Do(ctx, []byte("k1"), nop); err != nil || !r.Replayed { // a duplicate
		t.Fatalf("replay: %+v %v", r, err)
	}
	stale, _, err := g.Acquire(ctx, []byte("k2"))
	if err != nil || stale == nil {
		t.Fatalf("acquire k2: %v", err)
	}
	if _, _, err := g.Acquire(ctx, []byte("k2")); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("k2 held: %v", err)
	}
	clk.Advance(2 * time.Minute) // the stale holder's lease lapses
	succ, _, err := g.Acquire(ctx, []byte("k2"))
	if err != nil || succ == nil || succ.Attempts() != 2 {
		t.Fatalf("takeover: %v", err)
	}
	if err := stale.Complete(ctx, nil); !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("stale complete: %v, want ErrFenced", err)
	}
	if err := succ.Release(ctx, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Do(ctx, []byte("k3"), nop, idem.WithFingerprint([]byte("a"))); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Do(ctx, []byte("k3"), nop, idem.WithFingerprint([]byte("b"))); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	if _, err := g.Do(ctx, nil, nop); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	fs.SetDown(true)
	if _, err := g.Do(ctx, []byte("k4"), nop); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("store down: %v", err)
	}
	fs.SetDown(false)
	fs.Inject(faultstore.OpComplete, faultstore.Fault{}) // completions fail until cleared
	if _, err := g.Do(ctx, []byte("k5"), nop); !errors.Is(err, idem.ErrUnrecorded) {
		t.Fatalf("unrecorded: %v", err)
	}
	fs.Clear()

	open, err := idem.NewGuard(fs, idem.WithHooks(col.GuardHooks()), idem.WithFailOpen(true), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	fs.SetDown(true)
	if r, err := open.Do(ctx, []byte("k6"), nop); err != nil || !r.FailedOpen {
		t.Fatalf("fail-open: %+v %v", r, err)
	}
	fs.SetDown(false)

	got := scrape(t, reg)
	ns := `idem_namespace="orders"`
	want(t, got, map[string]float64{
		`idem_claims_total{` + ns + `,outcome="acquired"}`:                             5, // k1, k2 twice, k3, k5
		`idem_claims_total{` + ns + `,outcome="completed"}`:                            1,
		`idem_claims_total{` + ns + `,outcome="in_progress"}`:                          1,
		`idem_claims_total{` + ns + `,outcome="failed"}`:                               0,
		`idem_claims_total{` + ns + `,outcome="fingerprint_mismatch"}`:                 1,
		`idem_claims_total{` + ns + `,outcome="invalid"}`:                              1,
		`idem_claims_total{` + ns + `,outcome="error"}`:                                2, // k4 closed, k6 open
		`idem_claim_takeovers_total{` + ns + `}`:                                       1,
		`idem_settles_total{` + ns + `,action="complete",result="ok"}`:                 2, // k1, k3
		`idem_settles_total{` + ns + `,action="complete",result="fenced"}`:             1,
		`idem_settles_total{` + ns + `,action="complete",result="error"}`:              2, // k5: first try and one retry
		`idem_settles_total{` + ns + `,action="release",result="ok"}`:                  1,
		`idem_leases_lost_total{` + ns + `}`:                                           1,
		`idem_store_errors_total{` + ns + `,class="unavailable",operation="claim"}`:    2,
		`idem_store_errors_total{` + ns + `,class="unavailable",operation="complete"}`: 2,
		`idem_fail_open_passes_total{` + ns + `}`:                                      1,
		`idem_unrecorded_completions_total{` + ns + `,phase="pending"}`:                1,
		`idem_unrecorded_completions_total{` + ns + `,phase="abandoned"}`:              1,
		`idem_unrecorded_completions_total{` + ns + `,phase="recovered"}`:              0,
		`idem_store_operation_duration_seconds_count{` + ns + `,operation="claim"}`:    11,
		`idem_store_operation_duration_seconds_count{` + ns + `,operation="complete"}`: 5,
		`idem_store_operation_duration_seconds_count{` + ns + `,operation="release"}`:  1,
		`idem_claim_hold_duration_seconds_count{` + ns + `,action="complete"}`:         2,
		`idem_claim_hold_duration_seconds_count{` + ns + `,action="release"}`:          1,
	})
}
