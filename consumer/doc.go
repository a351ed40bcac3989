// Package consumer is idem's broker-neutral consumer runtime: it pulls
// deliveries from any broker.Subscriber and runs a handler on each through
// an idem.Guard, so each message's effect happens once however often the
// broker delivers it.
//
// Per delivery: the W3C trace context is taken from the traceparent header
// (broker.TraceFromContext; in batch mode there is no per-message context);
// the idempotency key (MessageIDKey, BusinessKey,
// JSONBusinessKey, JSONFieldsKey or your own KeyFunc) and a payload
// fingerprint are computed; the guard claims the key; then
//
//   - new: the handler runs (retried in process for short backoffs); its
//     completion is recorded and only then the message is acked;
//   - already completed (a duplicate): acked without running;
//   - in progress elsewhere: nak'ed with delay = the holder's remaining
//     lease, never acked (it may still fail);
//   - handler failed: the key is released and the message nak'ed with
//     exponential backoff; after MaxAttempts (or at once for
//     idem.Permanent errors) the key is marked failed and the message is
//     dead-lettered exactly once per distinct message (the publish is
//     itself guarded, by the message's identity), then terminated;
//   - store down, or a handler error classified as unavailability
//     (idem.ClassifyError, the store's idem.ErrorClassifier,
//     Config.ClassifyError): fail closed and hold the message: nothing
//     runs, nothing is acked and nothing is nak'ed (a nak spends one of the
//     broker's deliveries); a claim already held is kept, and the message
//     is retried in process until the store answers, spending no attempt;
//   - no usable key, or the key reused with another payload: dead-letter
//     (or reject, MissingKeyReject) — never silent processing.
//
// Every delivery is reported in progress to the broker (Acker.InProgress)
// from its fetch until it is settled. A message on its last broker
// delivery (broker.DeliveryLimiter) is never nak'ed: it is held and
// retried in process, and dead-lettered if the consumer stops meanwhile.
// A delivery the broker reports lost (broker.ErrDeliveryLost, from that
// signal or a settle: its connection closed, its partition was revoked) is
// not worked for any more: unless its handler is running (it runs to its
// end and is not retried), its claim is released so that the redelivered
// copy acquires the key at once, and it is dropped without a nak, a hold
// or a dead letter (Stats.Lost).
//
// Messages with the same order key (Message.Key, else the idempotency key)
// go to one worker in order; different keys run in parallel on Workers
// workers; a held message blocks only its own order key; at most
// MaxInFlight messages are fetched and unsettled at once.
// Run drains on shutdown. With a BatchHandler, each worker buffers up to
// Batch.Size messages or Batch.Wait, claims them in one store round trip
// (idem.Guard.AcquireBatch) and runs the handler on the new ones, each
// message's fencing token available through MessageToken and the
// handler's context cancelled if any claim is lost. With a TxHandler (one
// message) or TxBatchHandler (a batch) the handler claims, applies and
// completes in one transaction of the database that holds both the effects
// and the records (invariant 2; pgstore.TxHandler and TxBatchHandler, and
// mysqlstore's, build them on DoTx, ClaimBatchTx and CompleteBatchTx) and
// the runtime settles each message from the outcome it reports. A plain
// Handler may also call pgstore's or mysqlstore's DoTx on its message's
// key: DoTx completes the runtime's own claim (HeldToken) in the effect's
// transaction. WaitReady reports the subscriber's readiness
// (broker.Readier). Steps builds multi-step flows that resume at the first
// unfinished step. Hooks and Stats observe it. See docs/consumer.md.
//
// broker/membroker is an in-memory broker for tests and examples.
package consumer
