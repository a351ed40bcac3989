package kafkabroker

import (
	"testing"
	"time"

	"github.com/idem-dev/idem/e2etest"
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
// cpu-µs/msg includes the in-process kfake broker and franz-go.
func BenchmarkConsumeBatchPG(b *testing.B) {
	for _, variant := range []string{"baseline", "guard"} {
		b.Run(variant, func(b *testing.B) {
			c := newCluster(b)
			adm := admin(b, c)
			topic := createTopic(b, adm, 8)
			ledger := e2etest.NewLedger(b, "idem_kafka")
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
			insert := ledger.InsertBatch()
			const workers, batchSize = 4, 1000
			store := e2etest.MemStore(b) // made before the timer starts

			e2etest.BenchConsume(b, ledger, n, func() {
				switch variant {
				case "baseline":
					e2etest.RunBaseline(b, sub, insert, n, workers, batchSize)
				case "guard":
					e2etest.RunGuarded(b, e2etest.Guarded{Store: store, Subscriber: sub, Insert: insert, N: n, Workers: workers, BatchSize: batchSize})
				}
			})
		})
	}
}
