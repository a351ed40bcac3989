package rocketbroker_test

import (
	"sync"
	"testing"

	"github.com/idem-dev/idem/e2etest"
)

// BenchmarkConsumeBatchPG measures consume throughput from the fake broker
// (in process, loopback TCP; NOT a RocketMQ server: the figures compare
// the guard with its absence on the same transport, they say nothing of
// a real broker's speed) with the adapter's defaults except MaxInFlight
// 8,000 (the runtime's window below), a topic of 4 queues, into a durable
// PostgreSQL effect (one transaction + COPY per batch, synchronous
// commit), 4 workers, batches of up to 1,000:
//
//   - baseline: Fetch, COPY, Ack each, with the same parallelism and no
//     guard;
//   - guard: the consumer runtime in batch mode with the guard on the
//     memory store (AcquireBatch per batch, completion + ack per message);
//   - guard-pgstore: the same with the guard on pgstore, records durable
//     in the same PostgreSQL (a batch claim and a batch completion per
//     batch).
//
// b.N messages (no duplicates) are published before the timer starts.
// Use a fixed count: -benchtime 50000x.
func BenchmarkConsumeBatchPG(b *testing.B) {
	for _, variant := range []string{"baseline", "guard", "guard-pgstore"} {
		b.Run(variant, func(b *testing.B) {
			x := newTopic(b, 4)
			cfg := x.subConfig(b, "bench")
			cfg.MaxInFlight = 8000
			ledger := e2etest.NewLedger(b, "idem_rocket_bench")
			n := b.N
			publishParallel(b, x, n, 8)
			sub := subscriber(b, cfg)
			insert := ledger.InsertBatch()
			const workers, batchSize = 4, 1000
			g := e2etest.Guarded{Subscriber: sub, Insert: insert, N: n, Workers: workers, BatchSize: batchSize}
			switch variant {
			case "guard":
				g.Store = e2etest.MemStore(b)
			case "guard-pgstore":
				g.Store = e2etest.OpenPGStore(b, ledger) // migrated before the timer starts
			}
			e2etest.BenchConsume(b, ledger, n, func() {
				if variant == "baseline" {
					e2etest.RunBaseline(b, sub, insert, n, workers, batchSize)
				} else {
					e2etest.RunGuarded(b, g)
				}
			})
		})
	}
}

// publishParallel publishes messages 0..n-1 from par publishers at once
// (order does not matter here; one publisher sends one message per round
// trip).
func publishParallel(b *testing.B, x topic, n, par int) {
	b.Helper()
	var wg sync.WaitGroup
	for w := range par {
		p := x.publisher(b)
		wg.Go(func() {
			for i := w; i < n; i += par {
				if err := p.Publish(ctxT(b, 60e9), e2etest.Message(x.Name, i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
