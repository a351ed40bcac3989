package rabbitbroker_test

import (
	"testing"

	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/rabbitbroker"
)

// BenchmarkConsumeBatchPG measures consume throughput from RabbitMQ (the
// shared server, a quorum queue with the adapter's defaults but a prefetch
// of 8,000) into a durable PostgreSQL effect (one transaction + COPY per
// batch, synchronous commit), 4 workers, batches of up to 1,000:
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
// Use a fixed count: -benchtime 100000x.
func BenchmarkConsumeBatchPG(b *testing.B) {
	for _, variant := range []string{"baseline", "guard", "guard-pgstore"} {
		b.Run(variant, func(b *testing.B) {
			x := newTopo(b)
			cfg := x.subConfig(b, "bench")
			cfg.Prefetch = 8000
			if err := rabbitbroker.Declare(ctxT(b, 30e9), cfg); err != nil {
				b.Fatal(err)
			}
			ledger := e2etest.NewLedger(b, "idem_rabbit_bench")
			n := b.N
			publishWithDuplicates(b, x, n, 0)
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
