// Package idem makes each message's effect happen exactly once on top of
// brokers that deliver at least once.
//
// A Guard sits in front of a handler. For each message key it makes one
// atomic claim in a Store; the first claim runs the handler while a
// heartbeat extends its lease, then records the handler's result; a
// duplicate gets that result back (Result.Replayed) instead of running the
// handler again; a duplicate arriving while the first is still running gets
// ErrInProgress so the consumer retries later instead of acking.
//
//	guard, _ := idem.NewGuard(store, idem.WithTTL(72*time.Hour))
//	res, err := guard.Do(ctx, []byte(msg.ID), func(ctx context.Context) ([]byte, error) {
//		return chargeCard(ctx, msg)
//	}, idem.WithFingerprint(idem.FingerprintOf(msg.Payload)))
//
// Every claim carries a fencing token that grows per key. When a worker
// stalls past its lease and another takes over, the stalled worker's
// Complete, Release and Extend get ErrFenced and change nothing; its handler's
// context is cancelled with ErrLeaseLost. Pass the token (TokenFromContext,
// Held.Token) to effects that can check it.
//
// The Store interface is small and its contract is written on it; optional
// capabilities (BatchClaimer, Purger, Lister, Stater, Pinger) are separate
// interfaces found by type assertion. Implementations: memstore (here),
// boltstore (embedded file, the zero-setup default), redisstore, pgstore and
// mysqlstore, each in its own module so that this one needs nothing but the
// standard library. Every store passes the same conformance suite,
// github.com/idem-dev/idem/storetest.
//
// Errors are sentinels matched with errors.Is: ErrInProgress, ErrFailed,
// ErrFingerprintMismatch, ErrFenced, ErrNotFound, ErrUnavailable,
// ErrUnknownOutcome, ErrUnrecorded, ErrResultTooLarge, ErrInvalidKey,
// ErrInvalidArgument. ClassifyError (and a store's ErrorClassifier) maps a
// driver's connection errors onto ErrUnavailable and ErrUnknownOutcome.
// The guard fails closed when the store is down; WithFailOpen lets handlers
// run unrecorded when the store could not be reached at all, and reports
// each such pass to Hooks.OnFailOpen.
//
// A held claim keeps its heartbeat until its settle is recorded; a failed
// Complete is retried for as long as the lease allows, then in the
// background (docs/guard.md in the repository says what remains).
package idem
