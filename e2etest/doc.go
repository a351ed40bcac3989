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
//     its own message's payload. Each row also says who wrote it (the
//     claim's fencing token, the delivery count, the consumer named by
//     ConsumerConfig, the process, the transaction, the time).
//   - Evidence: when a test fails, the ledger's cleanup logs what explains
//     it (Ledger.Explain): the rows of the duplicated ids, their pgstore
//     records, and what the test's guards (NewGuard: claims again, leases
//     lost, settles refused or unrecorded) and consumers (their warnings)
//     reported about those keys, and where idem's goroutines are (a run
//     that stalls says where).
//   - Generate / Publish: messages msg-0000000... with a payload naming
//     their index, and a fraction published a second time a batch later
//     (through a second publisher where the broker would dedup them).
//   - ChaosSub: a subscriber wrapper that turns some first-delivery acks
//     into naks (effect done, ack lost) and can Crash like a dead process.
//   - RunBaseline, RunGuarded, BenchConsume: the two sides of the consume
//     benchmark (no guard vs the consumer runtime with the guard) and the
//     timing that reports msgs/s and cpu-µs/msg.
//   - The fault scenario (faults.go) each adapter's TestEndToEndFaults runs
//     on the adapter's default settings: StartChild / RunChild / Kill, a
//     consumer in a child process killed with SIGKILL while it holds
//     claims (its effects commit with their completions, so a kill leaves
//     neither: that is what makes a real kill survivable with the effect
//     in the same database); Outage, a store outage (faultstore) that
//     starts with messages held at a Gate after their claim and before
//     their effect, and must refuse settles (completions or releases)
//     and lease extensions of that work; Effects, handlers with flaky and poison messages; and
//     CheckFaultRun: every non-poison message exactly once in the ledger,
//     every poison message exactly once in the dead-letter destination,
//     no key in progress past its lease. Each fault is asserted to have hit
//     in-flight work (claims in progress after the kill, read from the
//     store; messages held when the store went down; refused calls of
//     every kind during it).
//   - The same with the records outside the ledger's database
//     (ChildConfig.Store, e.g. Redis): the child's effects commit apart
//     from their completions, so it applies ChildConfig.Apply effects and
//     then holds what it claims; the parent kills it once WaitRecorded has
//     seen every effect recorded, and CheckFaultRunOn reads the keys in
//     progress from the store (InProgressIn).
//
// The broker-specific parts stay with each adapter: starting the broker,
// the fault schedule (rebalance, kill, store outage, orphaned claims) and
// the drain check.
//
// The package is for tests only; IDEM_PG_URL overrides the PostgreSQL URL
// (default postgres://postgres@127.0.0.1:5432/test), IDEM_E2E_MESSAGES
// the number of messages (see Messages), and IDEM_BENCH_CPUPROFILE names a
// file for the CPU profile of BenchConsume's timed part alone.
package e2etest
