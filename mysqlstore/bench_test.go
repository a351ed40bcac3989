package mysqlstore_test

import (
	"context"
	"database/sql"
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

// BenchmarkCompleteBatch100 settles 100 held claims with one CompleteBatch
// and another 100 with 100 Completes in every iteration (alternating which
// goes first), so both are measured under the same load. ns/op includes
// the ClaimBatch of the 200 keys, which the metrics leave out; compare
// single-ms and batch-ms (per 100 completions) and single/batch.
func BenchmarkCompleteBatch100(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  mysqlstore.Config
	}{
		{"single", mysqlstore.Config{}},
		{"sharded4", mysqlstore.Config{Layout: mysqlstore.LayoutSharded, Shards: 4}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, _ := newStore(b, bc.cfg)
			ctx := testCtx(b)
			var single, batch time.Duration
			it := 0
			for b.Loop() {
				it++
				cs := claimN(b, s, fmt.Sprint("b", it), 200, time.Minute)
				one := func() {
					t0 := time.Now()
					for _, c := range cs[:100] {
						if err := s.Complete(ctx, c.Key, c.Token, c.Result); err != nil {
							b.Fatal(err)
						}
					}
					single += time.Since(t0)
				}
				many := func() {
					t0 := time.Now()
					errs, err := s.CompleteBatch(ctx, cs[100:])
					if err != nil {
						b.Fatal(err)
					}
					for _, e := range errs {
						if e != nil {
							b.Fatal(e)
						}
					}
					batch += time.Since(t0)
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
		})
	}
}

// BenchmarkDoTx runs, in every iteration, one DoTx of a new key whose
// effect inserts a ledger row, and the same effect in a bare transaction
// (BEGIN; INSERT; COMMIT), alternating which goes first, one caller. Compare
// dotx-ms with raw-ms (dotx/raw): the store's part of a transactional
// effect, under the same load.
func BenchmarkDoTx(b *testing.B) {
	s, db := newStore(b, mysqlstore.Config{})
	ctx := testCtx(b)
	if _, err := db.ExecContext(ctx, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARBINARY(1024) NOT NULL) ENGINE=InnoDB"); err != nil {
		b.Fatal(err)
	}
	effect := func(ctx context.Context, tx *sql.Tx, c idem.Claim) ([]byte, error) {
		_, err := tx.ExecContext(ctx, "INSERT INTO ledger (k) VALUES ('x')")
		return nil, err
	}
	var dotx, raw time.Duration
	n := 0
	for b.Loop() {
		n++
		for j := 0; j < 2; j++ {
			start := time.Now()
			if (n+j)%2 == 0 {
				if _, err := s.DoTx(ctx, idem.ClaimRequest{Key: fmt.Appendf(nil, "bench-%d", n), Lease: time.Minute, TTL: time.Hour}, effect); err != nil {
					b.Fatal(err)
				}
				dotx += time.Since(start)
				continue
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := effect(ctx, tx, idem.Claim{}); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			raw += time.Since(start)
		}
	}
	b.ReportMetric(float64(dotx.Microseconds())/1e3/float64(n), "dotx-ms")
	b.ReportMetric(float64(raw.Microseconds())/1e3/float64(n), "raw-ms")
	b.ReportMetric(float64(dotx)/float64(raw), "dotx/raw")
}
