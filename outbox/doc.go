// Package outbox is the producer half of idem: the transactional outbox and
// its relay (seed 000's message_send_log).
//
// A producer writes each message into an outbox table in the SAME
// transaction as its business change, so the message exists if and only if
// the change committed. Enqueue is backend-specific because it takes the
// caller's transaction: pgoutbox (pgx.Tx, in the pgstore module),
// mysqloutbox (*sql.Tx, in the mysqlstore module), boltoutbox (*bbolt.Tx,
// in the boltstore module, single node) and memoutbox (in memory, the
// reference). Each message has an ID fixed before the first send (a
// snowflake id by default), which the broker uses to deduplicate and the
// consumer's guard uses as its key, so a second publish is harmless.
//
// A Relay moves committed rows to the broker (broker.Publisher): it claims
// due rows in batches (SELECT ... FOR UPDATE SKIP LOCKED on SQL: any number
// of relays run at once, none waits for another, none takes another's
// rows), publishes them, and marks them sent. A failed publish reschedules
// the row with the seed's backoff (1s, x1.5, at most 10s, plus jitter);
// after MaxAttempts (3) the row is marked failed and Hooks.OnFailed raises
// the alert; Backend.ListFailed and Backend.Requeue bring it back. A broker
// outage spends no message's attempts: a round in which the broker took no
// message and every failure was its absence (idem.ErrUnavailable,
// idem.ErrUnknownOutcome, a timeout; not broker.ErrRejected) reschedules
// its rows without failing them, so with the default 3 attempts the relay
// waits out an outage of any length and catches up by itself. A relay
// that dies between publishing and marking sent leaves its rows to the next
// claim: they are published again (the one case of a duplicate publish).
// The relay never keeps a cursor over row ids, because rows commit out of id
// order; every claim looks at every due row through an index. With Ordered,
// a key's later message waits until the earlier one is sent or failed.
// PostgreSQL LISTEN/NOTIFY wakes relays right after a commit (Notifier);
// other backends are polled every 100ms. Sent rows are purged after
// Retention in small batches. Hooks report published batches, retries,
// failures, errors and periodic Stats (backlog, oldest unsent age, failed
// count).
//
// The contract of a backend is written on Backend and Batch; the
// conformance suite github.com/idem-dev/idem/outboxtest checks it, and the
// relay over it, for every backend. See docs/outbox.md for the design.
package outbox
