package streamsbroker_test

import (
	"testing"

	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/streamsbroker"
)

// BenchmarkConsumeBatchPG measures consume throughput from a stream on the
// shared Redis into a durable PostgreSQL effect (one transaction + COPY per
// batch, synchronous commit), batch mode, the adapter's default settings,
// in the same run:
//
//   - baseline: 4 goroutines each Fetch(1000), COPY in one transaction, Ack
//     each: no guard at all;
//   - guard: the consumer runtime with the guard on the memory store
//     (AcquireBatch per batch, Complete + Ack per message, fingerprints,
//     per-key routing, in-flight window);
//   - guard-pgstore: the same with the guard on pgstore, records durable in
//     the same PostgreSQL (one claim statement per batch, one completion
//     per message, 8 in parallel).
//
// b.N messages are published before the timer starts (no duplicates). Use
// a fixed count: -benchtime 100000x. docs/benchmarks/streamsbroker.md.
func BenchmarkConsumeBatchPG(b *testing.B) {
	c := sharedClient(b)
	for _, variant := range []string{"baseline", "guard", "guard-pgstore"} {
		b.Run(variant, func(b *testing.B) {
			stream := newStream(b, c)
			ledger := e2etest.NewLedger(b, "idem_streams_bench")
			n := b.N
			publishWithDuplicates(b, c, stream, n, 0)
			sub, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: c, Stream: stream, Group: "bench", Logger: e2etest.Quiet()})
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
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
