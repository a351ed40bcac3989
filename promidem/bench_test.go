package promidem_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkGuardDoHooks measures the collector's hooks on the guard's hot
// path: Do of a new key (claim, handler, complete) over memstore, on a
// bare guard and on one with GuardHooks, alternating per iteration so
// both see the same machine; it reports each side's ns/op and their
// ratio (hooked/bare).
//
//	flock /tmp/bench.lock go test -run '^$' -bench GuardDoHooks -count 6 ./promidem
func BenchmarkGuardDoHooks(b *testing.B) {
	newGuard := func(hooks ...idem.Hooks) *idem.Guard {
		st, err := memstore.New(memstore.Config{SweepInterval: -1, MaxEntries: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		g, err := idem.NewGuard(st, idem.WithLogger(quiet), idem.WithHooks(hooks...))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { g.Close() })
		return g
	}
	col, _ := promidem.New(promidem.Config{Namespace: "bench"})
	prometheus.NewRegistry().MustRegister(col)
	guards := [2]*idem.Guard{newGuard(), newGuard(col.GuardHooks())}
	var spent [2]time.Duration
	ctx := context.Background()
	fn := func(context.Context) ([]byte, error) { return nil, nil }
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		key := strconv.AppendInt(make([]byte, 0, 16), int64(i), 36)
		side := i & 1
		start := time.Now()
		if _, err := guards[side].Do(ctx, key, fn); err != nil {
			b.Fatal(err)
		}
		spent[side] += time.Since(start)
	}
	half := float64(max(b.N/2, 1))
	bare, hooked := float64(spent[0].Nanoseconds())/half, float64(spent[1].Nanoseconds())/half
	b.ReportMetric(bare, "bare-ns/op")
	b.ReportMetric(hooked, "hooked-ns/op")
	b.ReportMetric(hooked/bare, "hooked/bare")
}

// BenchmarkHookEvents is the collector's cost per guard event: one
// OnClaim and one OnSettle, as a Do of a new key raises them.
func BenchmarkHookEvents(b *testing.B) {
	col, _ := promidem.New(promidem.Config{Namespace: "bench"})
	h := col.GuardHooks()
	ctx := context.Background()
	ce := idem.ClaimEvent{Key: []byte("k"), Outcome: idem.OutcomeAcquired, Attempts: 1, Duration: 300 * time.Microsecond}
	se := idem.SettleEvent{Key: []byte("k"), Token: 1, Action: idem.SettleComplete, Held: 2 * time.Millisecond, Duration: 200 * time.Microsecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.OnClaim(ctx, ce)
			h.OnSettle(ctx, se)
		}
	})
}
