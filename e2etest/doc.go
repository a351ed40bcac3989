// Package e2etest holds the broker-independent parts of the end-to-end
// exactly-once tests and consume benchmarks that each broker adapter
// (kafkabroker, natsbroker) runs over the consumer runtime:
//
//   - Ledger: a PostgreSQL table in a schema unique to the test, with NO
//     unique constraint, so a message whose effect ran twice shows as two
//     rows; the schema is dropped at cleanup. PostgreSQL unreachable is a
//     test failure, never a skip. Its Insert / InsertBatch are the effects
//     (one durable INSERT; one transaction with COPY per batch) and
//     AssertExactlyOnce the verdict: every id exactly once, each row with
//     its own message's payload.
//   - Generate / Publish: messages msg-0000000... with a payload naming
//     their index, and a fraction published a second time a batch later
//     (through a second publisher where the broker would dedup them).
//   - ChaosSub: a subscriber wrapper that turns some first-delivery acks
//     into naks (effect done, ack lost) and can Crash like a dead process.
//   - RunBaseline, RunGuarded, BenchConsume: the two sides of the consume
//     benchmark (no guard vs the consumer runtime with the guard) and the
//     timing that reports msgs/s and cpu-µs/msg.
//
// The broker-specific parts stay with each adapter: starting the broker,
// the fault schedule (rebalance, kill, store outage, orphaned claims) and
// the drain check.
//
// The package is for tests only; IDEM_PG_URL overrides the PostgreSQL URL
// (default postgres://postgres@127.0.0.1:5432/test) and IDEM_E2E_MESSAGES
// the number of messages (see Messages).
package e2etest
