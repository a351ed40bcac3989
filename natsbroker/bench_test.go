package natsbroker_test

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
	"github.com/idem-dev/idem/natsbroker"
)

// BenchmarkConsumeBatchPG measures consume throughput from JetStream into a
// durable PostgreSQL effect (one transaction + COPY per batch, synchronous
// commit) in batch mode:
//
//   - guard: the consumer runtime with the guard on the memory store
//     (AcquireBatch per batch, Complete + ack per message);
//   - guard-pgstore: the same with the guard on pgstore, records durable
//     in the same PostgreSQL (a batch claim statement per batch, one
//     complete statement per message, 8 in parallel);
//   - tx-pgstore: a TxBatchHandler: claims (ClaimBatchTx), COPY and
//     completions (CompleteTx) in one transaction per batch: invariant 2;
//   - baseline: the same fetch / COPY / ack pipeline with the same
//     parallelism and no guard at all.
//
// b.N messages are published before the timer starts (no duplicates).
// Use a fixed count: -benchtime 100000x.
func BenchmarkConsumeBatchPG(b *testing.B) {
	for _, variant := range []string{"baseline", "guard", "guard-pgstore", "tx-pgstore"} {
		b.Run(variant, func(b *testing.B) {
			stream := newStream(b, nil)
			pool, table := newLedger(b)
			n := b.N
			publishWithDuplicates(b, stream, n, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{
				JS: js, Stream: stream, Durable: "bench", AckWait: 30 * time.Second, MaxAckPending: 50000,
			})
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			insert := insertBatch(pool, table)
			const workers, batchSize = 4, 1000

			b.ResetTimer()
			start := time.Now()
			cpu0 := cpuTime()
			switch variant {
			case "baseline":
				runBaseline(b, sub, insert, n, workers, batchSize)
			default:
				var store idem.Store
				var tx consumer.TxBatchHandler
				if variant == "guard-pgstore" || variant == "tx-pgstore" {
					pgs := newPGStore(b, pool, splitTable(table)[0])
					store = pgs
					if variant == "tx-pgstore" {
						tx = insertBatchTx(pool, pgs, table, nil)
					}
				} else {
					mem, err := memstore.New(memstore.Config{})
					if err != nil {
						b.Fatal(err)
					}
					defer mem.Close()
					store = mem
				}
				runGuarded(b, store, tx, sub, insert, n, workers, batchSize, func() (int, error) {
					var c int
					err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&c)
					return c, err
				})
			}
			elapsed := time.Since(start)
			cpu := cpuTime() - cpu0
			b.StopTimer()
			b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
			// CPU time of this process (user+system) per message: less
			// sensitive to the machine's load than wall-clock throughput.
			b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-us/msg")
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

// runBaseline: workers fetch a batch, COPY it in one transaction, ack each.
func runBaseline(b *testing.B, sub broker.Subscriber, insert consumer.BatchHandler, n, workers, batchSize int) {
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

func runGuarded(b *testing.B, store idem.Store, tx consumer.TxBatchHandler, sub broker.Subscriber, insert consumer.BatchHandler, n, workers, batchSize int, rows func() (int, error)) {
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
	var inHandler time.Duration
	cfg := consumer.Config{
		Subscriber:  sub,
		Guard:       guard,
		Workers:     workers,
		MaxInFlight: 2 * workers * batchSize,
		FetchBatch:  batchSize,
		Batch:       consumer.BatchConfig{Size: batchSize, Wait: 20 * time.Millisecond},
		BatchHandler: func(ctx context.Context, msgs []*broker.Message) error {
			t0 := time.Now()
			if err := insert(ctx, msgs); err != nil {
				return err
			}
			mu.Lock()
			batches++
			inHandler += time.Since(t0)
			count += len(msgs)
			if count == n {
				handled.Done()
			}
			mu.Unlock()
			return nil
		},
		Logger: quiet,
	}
	if tx != nil {
		cfg.BatchHandler, cfg.TxBatchHandler = nil, tx
	}
	c, err := consumer.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	if tx != nil {
		for c.Stats().Handled < int64(n) {
			time.Sleep(time.Millisecond)
		}
		handled.Done()
	}
	handled.Wait()
	if batches > 0 {
		b.Logf("%d batches, %.0f msgs avg, %s in the handler (summed over workers)", batches, float64(count)/float64(batches), inHandler)
	}
	cancel() // drains: the last batches are completed and acked
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if got, err := rows(); err != nil || got != n {
		b.Fatalf("rows %d, %v", got, err)
	}
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
