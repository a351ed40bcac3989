package mysqlstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// Quick in-process benchmarks on an empty table (durable commits, the
// server's settings). The 10M-row comparison is cmd/mysqlbench-idem.
func BenchmarkClaim(b *testing.B) {
	s, _ := newStore(b, mysqlstore.Config{})
	var n atomic.Int64
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		ctx := testCtx(b)
		for pb.Next() {
			k := fmt.Appendf(nil, "bench-%d", n.Add(1))
			if _, err := s.Claim(ctx, idem.ClaimRequest{Key: k, Lease: time.Minute, TTL: time.Hour}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkClaimBatch100(b *testing.B) {
	s, _ := newStore(b, mysqlstore.Config{})
	ctx := testCtx(b)
	n := 0
	reqs := make([]idem.ClaimRequest, 100)
	for b.Loop() {
		for i := range reqs {
			n++
			reqs[i] = idem.ClaimRequest{Key: fmt.Appendf(nil, "bench-%d", n), Lease: time.Minute, TTL: time.Hour}
		}
		if _, err := s.ClaimBatch(ctx, reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "claims/s")
}
