package snowflake_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/idem-dev/idem/snowflake"
)

// The rate benchmarks: one generator of the default layout (4,096 ids per
// millisecond at most) beside that layout's own ceiling, measured the same
// way in the same run. Target: >= 4,000,000 ids/s, i.e. >= 97.7% of the
// ceiling of 4,096,000/s.
//
//	flock /tmp/bench.lock go test -run '^$' -bench 'Rate|Unthrottled' -count 10 ./snowflake | tee b.txt; benchstat b.txt

// BenchmarkRate/ceiling hands out 4,096 counters per wall-clock
// millisecond and waits for the next, with nothing else: no generator of
// this layout can be faster.
func BenchmarkRate(b *testing.B) {
	b.Run("impl=ceiling", func(b *testing.B) {
		per := snowflake.DefaultLayout.PerMillisecond()
		ms, seq := time.Now().UnixMilli(), int64(0)
		var sink int64
		for b.Loop() {
			if seq == per {
				for {
					if now := time.Now().UnixMilli(); now > ms {
						ms, seq = now, 0
						break
					}
					runtime.Gosched()
				}
			}
			sink += ms<<22 | seq
			seq++
		}
		report(b, sink)
	})
	b.Run("impl=generator", func(b *testing.B) { benchNext(b, snowflake.Config{Worker: 1}) })
}

// BenchmarkUnthrottled is the cost of one Next when the sequence never runs
// out (22 sequence bits: 4M per millisecond): the headroom under the
// default layout's ceiling.
func BenchmarkUnthrottled(b *testing.B) {
	benchNext(b, snowflake.Config{Layout: snowflake.Layout{TimeBits: 41, WorkerBits: 0, SequenceBits: 22}})
}

func benchNext(b *testing.B, cfg snowflake.Config) {
	g, err := snowflake.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	var sink snowflake.ID
	for b.Loop() {
		id, err := g.Next()
		if err != nil {
			b.Fatal(err)
		}
		sink += id
	}
	report(b, int64(sink))
}

func report(b *testing.B, sink int64) {
	if sink == 1 {
		b.Log(sink)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ids/s")
}
