package kafkabroker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
)

// BenchmarkConsumeBatchPG measures consume throughput from Kafka (kfake, in
// process) into a durable PostgreSQL effect (one transaction + COPY per
// batch, synchronous commit) in batch mode:
//
//   - baseline: Fetch, COPY, Ack with the same batch size and no guard;
//   - guard: the consumer runtime with the guard on the memory store
//     (AcquireBatch per batch, Complete + Ack per message).
//
// b.N messages (no duplicates) are published before the timer starts. Use a
// fixed count: go test -run '^$' -bench ConsumeBatchPG -benchtime 100000x.
func BenchmarkConsumeBatchPG(b *testing.B) {
	for _, variant := range []string{"baseline", "guard"} {
		b.Run(variant, func(b *testing.B) {
			c := newCluster(b)
			adm := admin(b, c)
			topic := createTopic(b, adm, 8)
			pool, table := newLedger(b)
			n := b.N
			publishWithDuplicates(b, c, topic, 0, n, 0)
			cfg := fastSub(c, uniq("bench"), topic)
			cfg.SessionTimeout = 10 * time.Second
			cfg.HeartbeatInterval = time.Second
			cfg.MaxUnsettled = 20000
			sub, err := NewSubscriber(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			insert := insertBatch(pool, table)
			const workers, batchSize = 4, 1000

			b.ResetTimer()
			start, cpu0 := time.Now(), cpuTime()
			switch variant {
			case "baseline":
				benchBaseline(b, sub, insert, n, workers, batchSize)
			case "guard":
				benchGuarded(b, sub, insert, n, workers, batchSize)
			}
			elapsed, cpu := time.Since(start), cpuTime()-cpu0
			b.StopTimer()
			b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
			// Process CPU (adapter, runtime, guard, franz-go and the
			// in-process kfake broker; PostgreSQL is another process).
			b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/msg")
			var rows int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&rows); err != nil {
				b.Fatal(err)
			}
			if rows != n {
				b.Fatalf("ledger has %d rows, want %d", rows, n)
			}
		})
	}
}

// benchBaseline: workers take turns to Fetch a batch, COPY it in one
// transaction and ack each message.
func benchBaseline(b *testing.B, sub broker.Subscriber, insert consumer.BatchHandler, n, workers, batchSize int) {
	var mu sync.Mutex
	done := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				msgs, err := sub.Fetch(ctx, batchSize)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
						b.Error(err)
					}
					return
				}
				if err := insert(ctx, msgs); err != nil {
					b.Error(err)
					return
				}
				for _, m := range msgs {
					_ = m.Acker.Ack(ctx)
				}
				mu.Lock()
				done += len(msgs)
				if done >= n {
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func benchGuarded(b *testing.B, sub broker.Subscriber, insert consumer.BatchHandler, n, workers, batchSize int) {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	guard, err := idem.NewGuard(store, idem.WithLogger(quiet))
	if err != nil {
		b.Fatal(err)
	}
	defer guard.Close()
	var handled sync.WaitGroup
	handled.Add(1)
	var mu sync.Mutex
	count, batches := 0, 0
	c, err := consumer.New(consumer.Config{
		Subscriber:  sub,
		Guard:       guard,
		Workers:     workers,
		MaxInFlight: 2 * workers * batchSize,
		FetchBatch:  batchSize,
		Batch:       consumer.BatchConfig{Size: batchSize, Wait: 20 * time.Millisecond},
		BatchHandler: func(ctx context.Context, msgs []*broker.Message) error {
			if err := insert(ctx, msgs); err != nil {
				return err
			}
			mu.Lock()
			batches++
			count += len(msgs)
			if count == n {
				handled.Done()
			}
			mu.Unlock()
			return nil
		},
		Logger: quiet,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	handled.Wait()
	b.Logf("%d batches, %.0f msgs avg", batches, float64(count)/float64(batches))
	cancel() // drains: the last batches are completed and acked
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
