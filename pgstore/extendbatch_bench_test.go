package pgstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// BenchmarkExtendBatch256 extends the leases of 256 held claims the way the
// guard's heartbeat did before ExtendBatch (256 Extends at once, a goroutine
// each, on the shared 24-connection pool) and the way it does now (one
// ExtendBatch), alternating which goes first in every iteration so both run
// under the same load. Compare single-ms and batch-ms (per 256 extends) and
// the pool's connection acquires per round (single-acq, batch-acq).
func BenchmarkExtendBatch256(b *testing.B) {
	const n = 256
	s, _ := newStore(b, layouts[0], "bench-extend")
	ctx := ctxT(b)
	reqs := make([]idem.ClaimRequest, 2*n)
	for i := range reqs {
		reqs[i] = idem.ClaimRequest{Key: fmt.Appendf(nil, "k%04d", i), Lease: time.Hour, TTL: time.Hour}
	}
	res, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		b.Fatal(err)
	}
	es := make([]idem.Extension, 2*n)
	for i, r := range res {
		if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
			b.Fatalf("claim %d: %+v", i, r)
		}
		es[i] = idem.Extension{Key: reqs[i].Key, Token: r.Claim.Record.Token, Lease: time.Hour}
	}
	pool := sharedPool(b)
	var single, batch time.Duration
	var singleAcq, batchAcq int64
	it := 0
	for b.Loop() {
		it++
		one := func() {
			a0, t0 := pool.Stat().AcquireCount(), time.Now()
			var wg sync.WaitGroup
			for _, x := range es[:n] {
				wg.Go(func() {
					if err := s.Extend(ctx, x.Key, x.Token, x.Lease); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			single += time.Since(t0)
			singleAcq += pool.Stat().AcquireCount() - a0
		}
		many := func() {
			a0, t0 := pool.Stat().AcquireCount(), time.Now()
			errs, err := s.ExtendBatch(ctx, es[n:])
			if err != nil {
				b.Fatal(err)
			}
			for _, e := range errs {
				if e != nil {
					b.Fatal(e)
				}
			}
			batch += time.Since(t0)
			batchAcq += pool.Stat().AcquireCount() - a0
		}
		if it%2 == 0 {
			one()
			many()
		} else {
			many()
			one()
		}
	}
	b.ReportMetric(float64(single.Microseconds())/1000/float64(it), "single-ms")
	b.ReportMetric(float64(batch.Microseconds())/1000/float64(it), "batch-ms")
	b.ReportMetric(float64(single)/float64(batch), "single/batch")
	b.ReportMetric(float64(singleAcq)/float64(it), "single-acq")
	b.ReportMetric(float64(batchAcq)/float64(it), "batch-acq")
}
