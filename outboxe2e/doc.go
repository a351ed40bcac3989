// Package outboxe2e holds the producer side's process and end-to-end tests
// (there is no library code here). They run against the machine's
// PostgreSQL, MariaDB and NATS JetStream, an embedded nats-server, and
// Kafka on kfake, and fail when a server is unreachable:
//
//   - TestRelayCrashAfterPublish: a relay process is SIGKILLed at a crash
//     point (OUTBOXE2E_CRASH_AFTER_PUBLISH) right after the broker acked a
//     batch and before the relay marked it sent, on PostgreSQL and MariaDB.
//     The next relay publishes that batch again; with the broker's dedup off
//     the duplicates reach the stream, and a guarded consumer still applies
//     each message once.
//   - TestTwoRelayProcesses: two relay processes drain one outbox while
//     producers commit: every message is published by exactly one of them,
//     once (counted at the broker, dedup off).
//   - TestBrokerOutage: the broker (an embedded nats-server) is shut down
//     for longer than the relay's whole backoff and started again: with
//     unlimited attempts, and with the seed's 3 (an outage spends no
//     message's attempts), the relay catches up by itself and no message
//     fails. Nothing is lost; the guarded consumer applies each once.
//   - TestEndToEnd: business transactions (an order row plus its message,
//     10% rolled back) through the outbox, two relays whose publisher
//     loses acks now and then, NATS or Kafka, and a guarded consumer that
//     loses acks too, into a ledger with no unique constraint. Message ids
//     are snowflake ids from a generator that leases its worker id from the
//     records store, and the records store uses the time-ordered layout
//     keyed on them (Layout.KeyTime). Every committed business change has
//     exactly one effect, and no rolled-back one has any.
//
// The tests re-execute the test binary as the relay process (see
// child_test.go); OUTBOXE2E_* environment variables select its role.
package outboxe2e
