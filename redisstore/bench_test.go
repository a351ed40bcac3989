package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// benchAddr is the server the benchmarks use: $IDEM_BENCH_REDIS (bench.sh
// starts a dedicated one) or the shared server.
func benchAddr() string {
	if a := os.Getenv("IDEM_BENCH_REDIS"); a != "" {
		return a
	}
	return redistest.SharedAddr
}

// BenchmarkClaim measures claims of new keys (the common path: a first
// delivery) with 1, 8 and 64 concurrent callers: one key per Claim
// without coalescing (single: Config.NoCoalesce), one key per Claim with the
// default coalescing (coalesced; $IDEM_BENCH_INFLIGHT overrides
// Config.CoalesceInFlight), or 64 keys per ClaimBatch (batch64). It reports
// claims/s and the p50/p99 latency of one call. bench.sh runs it beside
// redis-benchmark SET NX, and beside gosetnx: the same loop doing a bare
// go-redis SET NX PX per key instead of a claim, the ceiling of any store
// built on this client (at 1 caller, one round trip's client work is a
// large part of the whole).
func BenchmarkClaim(b *testing.B) {
	for _, mode := range []struct {
		name     string
		batch    int
		coalesce bool
		setnx    bool
	}{{"single", 1, false, false}, {"coalesced", 1, true, false}, {"batch64", 64, false, false}, {"gosetnx", 1, false, true}} {
		for _, callers := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", mode.name, callers), func(b *testing.B) {
				benchClaims(b, callers, mode.batch, mode.coalesce, mode.setnx)
			})
		}
	}
}

func benchClaims(b *testing.B, callers, batch int, coalesce, setnx bool) {
	client := redis.NewClient(&redis.Options{Addr: benchAddr(), PoolSize: callers + 4, MaxRetries: -1})
	defer client.Close()
	prefix := uniquePrefix()
	inflight, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_INFLIGHT"))
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: client, Prefix: prefix, SkipChecks: true,
		NoCoalesce: !coalesce, CoalesceInFlight: inflight})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		s.Close()
		redistest.DropPrefix(b, client, prefix)
	}()
	ctx := context.Background()
	var next atomic.Int64
	lat := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range callers {
		wg.Go(func() {
			reqs := make([]idem.ClaimRequest, batch)
			for {
				n := next.Add(int64(batch)) - int64(batch)
				if n >= int64(b.N) {
					return
				}
				for i := range reqs {
					reqs[i] = idem.ClaimRequest{Key: []byte("k" + strconv.FormatInt(n+int64(i), 10)), Lease: time.Minute, TTL: time.Minute}
				}
				var err error
				t0 := time.Now()
				if setnx {
					err = client.SetArgs(ctx, prefix+string(reqs[0].Key), "x", redis.SetArgs{Mode: "NX", TTL: time.Minute}).Err()
					if err == redis.Nil {
						err = nil
					}
				} else if batch == 1 {
					_, err = s.Claim(ctx, reqs[0])
				} else {
					_, err = s.ClaimBatch(ctx, reqs)
				}
				lat[g] = append(lat[g], time.Since(t0))
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	claims := len(all) * batch
	b.ReportMetric(float64(claims)/el.Seconds(), "claims/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkComplete64 settles 64 held claims per iteration both ways, in the
// same iteration so both see the same machine load: 64 Complete calls one
// after another (what a batch consumer does without idem.BatchCompleter)
// and one CompleteBatch of 64 (the order alternates between iterations).
// The claims are taken with the timer stopped. It reports the median time
// of each way and their ratio (speedup = singles / batch).
func BenchmarkComplete64(b *testing.B) {
	const n = 64
	client := redis.NewClient(&redis.Options{Addr: benchAddr(), MaxRetries: -1})
	defer client.Close()
	prefix := uniquePrefix()
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: client, Prefix: prefix, SkipChecks: true})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		s.Close()
		redistest.DropPrefix(b, client, prefix)
	}()
	ctx := context.Background()
	reqs := make([]idem.ClaimRequest, 2*n)
	var singles, batches []time.Duration
	result := []byte("ok")
	for it := 0; b.Loop(); it++ {
		b.StopTimer()
		for i := range reqs {
			reqs[i] = idem.ClaimRequest{Key: []byte("k" + strconv.Itoa(it*2*n+i)), Lease: time.Minute, TTL: time.Minute}
		}
		res, err := s.ClaimBatch(ctx, reqs)
		if err != nil {
			b.Fatal(err)
		}
		cs := make([]idem.Completion, len(res))
		for i, r := range res {
			cs[i] = idem.Completion{Key: reqs[i].Key, Token: r.Claim.Record.Token, Result: result}
		}
		b.StartTimer()
		single := func(cs []idem.Completion) {
			t0 := time.Now()
			for _, c := range cs {
				if err := s.Complete(ctx, c.Key, c.Token, c.Result); err != nil {
					b.Fatal(err)
				}
			}
			singles = append(singles, time.Since(t0))
		}
		batch := func(cs []idem.Completion) {
			t0 := time.Now()
			errs, err := s.CompleteBatch(ctx, cs)
			batches = append(batches, time.Since(t0))
			if err != nil || slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
				b.Fatal(err, errs)
			}
		}
		if it%2 == 0 {
			single(cs[:n])
			batch(cs[n:])
		} else {
			batch(cs[:n])
			single(cs[n:])
		}
	}
	slices.Sort(singles)
	slices.Sort(batches)
	ms, mb := singles[len(singles)/2], batches[len(batches)/2]
	b.ReportMetric(float64(ms.Microseconds()), "singles-µs/64")
	b.ReportMetric(float64(mb.Microseconds()), "batch-µs/64")
	b.ReportMetric(float64(ms)/float64(mb), "speedup")
}
