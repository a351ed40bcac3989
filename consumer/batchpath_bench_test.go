package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/memstore"
)

// BenchmarkBatchPath is the guarded batch path of one worker on one
// goroutine, without the runtime's goroutines and channels: batches of
// 1,000 fresh messages from the in-memory broker are prepared (key,
// fingerprint, routing) and handed to processBatch (AcquireBatch on the
// memory store, a no-op batch handler, the completions, the acks). The
// broker's fetch is outside the timer. An op is one message; cpu-µs/msg
// counts every goroutine (the GC's included). On a shared machine it moves
// much less than BenchmarkRuntime.
//
//	go test -run '^$' -bench BatchPath/fast -benchtime 200000x -count 8 ./consumer
//	go test -run '^$' -bench BatchPath/slow -benchtime 50000x -count 8 ./consumer
func BenchmarkBatchPath(b *testing.B) {
	// slow: a handler of 60 ms per batch (sleeping, so it adds no CPU of
	// its own), longer than the runtime's lease watcher used to wait
	// before it started: what a database transaction takes under load.
	for _, wait := range []time.Duration{0, 60 * time.Millisecond} {
		name := "fast"
		if wait > 0 {
			name = "slow"
		}
		b.Run(name, func(b *testing.B) { benchBatchPath(b, wait) })
	}
}

func benchBatchPath(b *testing.B, wait time.Duration) {
	const size = 1000
	mb, _ := membroker.New(membroker.Config{AckWait: time.Minute})
	pub := mb.NewPublisher()
	sub := mb.NewSubscriber("t", "g")
	defer sub.Close()
	st, _ := memstore.New(memstore.Config{})
	defer st.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	g, _ := idem.NewGuard(st, idem.WithLogger(quiet))
	defer g.Close()
	c, err := New(Config{Subscriber: sub, Guard: g, Logger: quiet, Workers: 1, MaxInFlight: size,
		BatchHandler: func(context.Context, []*broker.Message) error {
			time.Sleep(wait)
			return nil
		},
		Batch: BatchConfig{Size: size, Wait: time.Millisecond}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	msgs := make([]*broker.Message, size)
	batch := make([]*delivery, 0, size)
	var cpu time.Duration
	b.ResetTimer()
	b.StopTimer()
	for done := 0; done < b.N; {
		n := min(size, b.N-done)
		for i := range msgs[:n] {
			msgs[i] = &broker.Message{ID: fmt.Sprintf("m-%d", done+i), Topic: "t", Payload: []byte(`{"amount":10}`)}
		}
		if err := pub.Publish(ctx, msgs[:n]...); err != nil {
			b.Fatal(err)
		}
		got, err := sub.Fetch(ctx, n)
		if err != nil || len(got) != n {
			b.Fatalf("fetched %d of %d: %v", len(got), n, err)
		}
		c.win.take(n)
		c.stats.inFlight.Add(int64(n))
		cpu0 := cpuTime()
		b.StartTimer()
		now := time.Now()
		batch = batch[:0]
		for _, m := range got {
			d := c.prepare(m)
			if c.inflight != nil {
				c.inflight.add(d, now)
			}
			batch = append(batch, d)
		}
		if hs, later := c.processBatch(ctx, batch); len(hs) > 0 || len(later) > 0 {
			b.Fatalf("%d held, %d left for later", len(hs), len(later))
		}
		b.StopTimer()
		cpu += cpuTime() - cpu0
		done += n
	}
	if h := c.Stats().Handled; h != int64(b.N) {
		b.Fatalf("handled %d of %d", h, b.N)
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/msg")
}

// CPUTime is cpuTime for the external tests' benchmarks.
var CPUTime = cpuTime

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
