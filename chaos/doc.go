// Package chaos is idem's fault harness: it proves exactly-once with real
// processes, real kills, real restarts and partitions, on one machine, the
// way Kafka's system tests and Jepsen do.
//
// A run is a list of cells, each one scenario on one store (bolt: the
// embedded store in a store-server process; pg; redis; mysql) and one
// broker (nats: nats-server from PATH; kafka: kfake in the harness's
// process, reached over TCP). For each cell the harness:
//
//   - owns its servers: a PostgreSQL cluster (initdb) for the ledger and
//     the outbox (and the pg store), redis-server, MariaDB, nats-server,
//     kfake, each in a temporary directory on ports of its own (never the
//     machine's shared servers), and an in-process toxiproxy in front of
//     the store; with root, a network namespace for the workers whose link
//     to the store it can cut;
//   - starts consumer and outbox-relay processes by re-executing its own
//     binary (MaybeWorker), each with a counter file it maps, so that a
//     process stopped with SIGSTOP shows exactly what it held;
//   - produces unique ids through the transactional outbox (pgoutbox) and
//     publishes 20% of them a second time straight to the broker;
//   - injects the scenario's faults from a seeded random schedule, each
//     checked to have hit in-flight work;
//   - heals, drains, and checks: every message's effect exactly once in a
//     ledger without a unique constraint, no unknown id, every poison
//     message on the dead-letter destination exactly once, no key in
//     progress past its lease.
//
// The effect is a ledger row. With pgstore it commits with the claim's
// completion (CompleteTx) in one transaction; with a store elsewhere the
// effect's transaction keeps a fence row per key (the highest token that
// applied it), so a stale holder is refused and an effect a crashed holder
// applied without completing is not applied again; every such re-run is
// recorded and must follow a fault on the previous holder.
//
// The command is cmd/idem-chaos; CI runs TestShortPass. See
// docs/reliability.md for the scenarios, the fault catalogue they cover
// and the last results.
package chaos
