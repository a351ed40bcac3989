package natsbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/e2etest"
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
//   - tx-pgstore: pgstore.TxBatchHandler: claims (ClaimBatchTx), COPY and
//     completions (CompleteBatchTx) in one transaction per batch:
//     invariant 2;
//   - baseline: the same fetch / COPY / ack pipeline with the same
//     parallelism and no guard at all.
//
// b.N messages are published before the timer starts (no duplicates).
// Use a fixed count: -benchtime 100000x.
func BenchmarkConsumeBatchPG(b *testing.B) {
	for _, variant := range []string{"baseline", "guard", "guard-pgstore", "tx-pgstore"} {
		b.Run(variant, func(b *testing.B) {
			stream := newStream(b, nil)
			ledger := e2etest.NewLedger(b, "idem_e2e")
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
			insert := ledger.InsertBatch()
			const workers, batchSize = 4, 1000
			g := e2etest.Guarded{Subscriber: sub, Insert: insert, N: n, Workers: workers, BatchSize: batchSize}
			switch variant {
			case "guard":
				g.Store = e2etest.MemStore(b)
			case "guard-pgstore", "tx-pgstore":
				// Migrated before the timer starts.
				pgs := e2etest.OpenPGStore(b, ledger)
				g.Store = pgs
				if variant == "tx-pgstore" {
					g.Tx = insertBatchTx(b, ledger, pgs, nil)
				}
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
