// Package outboxtest is the conformance suite every outbox.Backend runs
// against its real database, as storetest is for stores:
//
//	func TestConformance(t *testing.T) {
//		outboxtest.Run(t, func(t testing.TB) outboxtest.Harness {
//			ob := ... a fresh outbox table, configured with NewID ...
//			return outboxtest.Harness{Backend: ob, Begin: ..., Crash: ...}
//		}, outboxtest.Features{ConcurrentTx: true})
//	}
//
// It checks the contract written on outbox.Backend and the Relay over it:
// messages round-trip byte for byte (headers with any bytes, the trace
// context taken from the context), invalid messages are refused before any
// I/O, duplicate ids are refused, a rolled-back transaction leaves nothing
// to publish, claims come in order up to their limit and skip rows another
// claim holds (SKIP LOCKED) instead of waiting, a transaction committing
// out of Seq order is still published (no cursor), settlements mark rows
// sent, rescheduled or failed atomically, a crashed claimer's rows come back
// unchanged, failed rows are listed and re-queued, sent rows are purged in
// batches, stats count the backlog, per-key order holds, any error text
// (NUL, invalid UTF-8, too long) is stored, and a call of several messages
// at the payload limit is written. With the relay: every message published
// exactly once by several relays at once, a second publish only after a
// crash between publish and mark-sent, a shutdown right after publishing
// still marking the batch sent, a frozen relay's rows freed after its Hold
// (Features.HoldEnds), a row whose headers do not decode failed alone, the
// seed's backoff schedule on an injected clock, failed plus the hook after
// the last attempt, one bad message not costing its batch an attempt, a
// broker outage longer than the backoff losing nothing, per-key order with
// several relays and a flaky broker, and the stats hook.
//
// Recorder (a broker.Publisher that keeps what it was given), Clock and
// WaitFor are exported for backends' own tests. The suite is its own module
// so that the core keeps no test dependency; its own test runs it against
// memoutbox.
package outboxtest
