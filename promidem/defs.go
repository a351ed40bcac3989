package promidem

// Metric names, by where their values come from. Every label has a fixed,
// small set of values (listed in metricDefs); no key, message id or error
// text ever becomes a label.
const (
	mClaims           = "idem_claims_total"
	mTakeovers        = "idem_claim_takeovers_total"
	mSettles          = "idem_settles_total"
	mLeasesLost       = "idem_leases_lost_total"
	mStoreErrors      = "idem_store_errors_total"
	mStoreDuration    = "idem_store_operation_duration_seconds"
	mHoldDuration     = "idem_claim_hold_duration_seconds"
	mFailOpen         = "idem_fail_open_passes_total"
	mUnrecorded       = "idem_unrecorded_completions_total"
	mRecords          = "idem_records"
	mAcks             = "idem_consumer_acks_total"
	mNaks             = "idem_consumer_naks_total"
	mHolds            = "idem_consumer_holds_total"
	mHoldRetries      = "idem_consumer_hold_retries_total"
	mDeadLetters      = "idem_consumer_dead_letters_total"
	mUnrecordedAcks   = "idem_consumer_unrecorded_acks_total"
	mInFlight         = "idem_consumer_in_flight_messages"
	mHeld             = "idem_consumer_held_messages"
	mSettleErrors     = "idem_consumer_broker_settle_errors_total"
	mLostDeliveries   = "idem_consumer_lost_deliveries_total"
	mLag              = "idem_broker_lag_messages"
	mOutboxPublished  = "idem_outbox_published_total"
	mOutboxPubDur     = "idem_outbox_publish_duration_seconds"
	mOutboxDelay      = "idem_outbox_publish_delay_seconds"
	mOutboxRetries    = "idem_outbox_retries_total"
	mOutboxFailures   = "idem_outbox_failures_total"
	mOutboxErrors     = "idem_outbox_errors_total"
	mOutboxMessages   = "idem_outbox_messages"
	mOutboxOldest     = "idem_outbox_oldest_pending_age_seconds"
	mPollErrors       = "idem_poll_errors_total"
	labelNamespace    = "idem_namespace"
	sourceGuard       = "idem.Hooks"
	sourceConsumer    = "consumer.Hooks"
	sourceOutbox      = "outbox.Hooks"
	sourceStater      = "WatchStore (idem.Stater)"
	sourceConsumerSts = "WatchConsumer (consumer.Stats)"
	sourceLag         = "WatchLag (broker.LagReporter)"
	sourceCollector   = "the Collector"
)

// Label values. Their order is the index of the pre-resolved series.
var (
	claimOutcomes  = []string{"acquired", "completed", "in_progress", "failed", "fingerprint_mismatch", "invalid", "error"}
	storeOps       = []string{"claim", "complete", "release", "fail"}
	settleActions  = []string{"complete", "release", "fail"}
	settleResults  = []string{"ok", "fenced", "not_found", "error"}
	errorClasses   = []string{"unavailable", "unknown_outcome", "capacity", "corrupt", "closed", "context", "other"}
	unrecPhases    = []string{"pending", "recovered", "abandoned"}
	recordStates   = []string{"in_progress", "completed", "failed", "released"}
	ackResults     = []string{"handled", "duplicate"}
	holdReasons    = []string{"store_unavailable", "handler_unavailable", "delivery_limit", "dead_letter", "other"}
	deadResults    = []string{"published", "terminated", "publish_failed"}
	outboxOps      = []string{"claim", "settle", "purge", "stats", "listen", "other"}
	outboxStatuses = []string{"pending", "failed"}
	pollSources    = []string{"store", "broker"}
)

// metricDef describes one metric family: the source of truth for the
// collector, the tests and the reference table in docs/observability.md.
type metricDef struct {
	name   string
	typ    string // counter, gauge or histogram
	labels []string
	values [][]string // the values of each label, in labels order
	source string
	help   string
}

var metricDefs = []metricDef{
	{mClaims, "counter", []string{"outcome"}, [][]string{claimOutcomes}, sourceGuard,
		"Claims by outcome: acquired (the handler runs), completed (a duplicate: the stored result is replayed), in_progress (another holder's lease is live), failed (the key failed for good), fingerprint_mismatch (the key was first claimed with another payload), invalid (rejected before any I/O), error (the store failed: see idem_store_errors_total). Batch claims count each key."},
	{mTakeovers, "counter", nil, nil, sourceGuard,
		"Claims acquired with Attempts > 1: an earlier holder released the key, or its lease lapsed and this claim took it over."},
	{mSettles, "counter", []string{"action", "result"}, [][]string{settleActions, settleResults}, sourceGuard,
		"Store calls settling a held claim, retries included, by action and result: ok, fenced (the claim was taken over: a stale holder was stopped), not_found (the record is gone), error (the store failed)."},
	{mLeasesLost, "counter", nil, nil, sourceGuard,
		"Held claims found taken over or removed while held (by the heartbeat or at settle); the handler's context was cancelled."},
	{mStoreErrors, "counter", []string{"operation", "class"}, [][]string{storeOps, errorClasses}, sourceGuard,
		"Store calls that failed, by operation and class: unavailable (not reached, nothing applied), unknown_outcome (may have been applied), capacity, corrupt, closed, context (cancelled or timed out), other."},
	{mStoreDuration, "histogram", []string{"operation"}, [][]string{storeOps}, sourceGuard,
		"Time spent in the store per claim or settle call, failures included. A batch call is observed once per key with the batch's time."},
	{mHoldDuration, "histogram", []string{"action"}, [][]string{settleActions}, sourceGuard,
		"Time from an acquired claim to its recorded settle (the handler plus the settle), by action."},
	{mFailOpen, "counter", nil, nil, sourceGuard,
		"Handler runs let through without a record because the store could not be reached (WithFailOpen only): each may duplicate an effect."},
	{mUnrecorded, "counter", []string{"phase"}, [][]string{unrecPhases}, sourceGuard,
		"Completions the store did not record in time, by phase: pending (the caller got ErrUnrecorded; the guard retries in the background), recovered (a background retry recorded it), abandoned (the guard gave up: a redelivery after the lease lapses may run the effect again)."},
	{mRecords, "gauge", []string{"state"}, [][]string{recordStates}, sourceStater,
		"Live records by state, polled at most once per PollInterval. Absent while the poll fails (see idem_poll_errors_total)."},
	{mAcks, "counter", []string{"result"}, [][]string{ackResults}, sourceConsumer,
		"Messages acked by the consumer runtime: handled (the handler ran and its effect is recorded) or duplicate (the key was already done; the handler did not run)."},
	{mNaks, "counter", nil, nil, sourceConsumer,
		"Messages handed back to the broker for redelivery."},
	{mHolds, "counter", []string{"reason"}, [][]string{holdReasons}, sourceConsumer,
		"Deliveries the consumer kept in process instead of handing them back, by reason."},
	{mHoldRetries, "counter", []string{"reason"}, [][]string{holdReasons}, sourceConsumer,
		"Retries of held deliveries that failed again, by reason."},
	{mDeadLetters, "counter", []string{"result"}, [][]string{deadResults}, sourceConsumer,
		"Dead-letterings: published to the dead-letter topic, terminated without a publish, or publish_failed (the message is held and the publish retried)."},
	{mUnrecordedAcks, "counter", nil, nil, sourceConsumer,
		"Messages acked although the store did not record their completion (the effect is done; see idem_unrecorded_completions_total)."},
	{mInFlight, "gauge", nil, nil, sourceConsumerSts,
		"Fetched deliveries not settled yet (handled, queued or held), summed over watched consumers."},
	{mHeld, "gauge", nil, nil, sourceConsumerSts,
		"Deliveries held now, summed over watched consumers."},
	{mSettleErrors, "counter", nil, nil, sourceConsumerSts,
		"Ack, nak and term calls the broker refused, summed over watched consumers."},
	{mLostDeliveries, "counter", nil, nil, sourceConsumerSts,
		"Deliveries the broker reported lost (broker.ErrDeliveryLost: connection closed, partition revoked...) before the consumer settled them; the broker delivers them again. Summed over watched consumers."},
	{mLag, "gauge", nil, nil, sourceLag,
		"Messages of the watched subscriptions not settled yet (broker.LagReporter), polled at most once per PollInterval. Absent while the poll fails."},
	{mOutboxPublished, "counter", nil, nil, sourceOutbox,
		"Outbox messages published and marked sent by the relay."},
	{mOutboxPubDur, "histogram", nil, nil, sourceOutbox,
		"Time of the relay's publish call(s) per batch."},
	{mOutboxDelay, "histogram", nil, nil, sourceOutbox,
		"Time from an outbox message's commit (CreatedAt) to its publish, per message (one clock only when relay and backend share it)."},
	{mOutboxRetries, "counter", nil, nil, sourceOutbox,
		"Outbox messages whose publish failed and was rescheduled."},
	{mOutboxFailures, "counter", nil, nil, sourceOutbox,
		"Outbox messages marked failed after their last attempt: they wait for an operator (Requeue)."},
	{mOutboxErrors, "counter", []string{"operation"}, [][]string{outboxOps}, sourceOutbox,
		"Failures of the relay's own operations against its backend, by operation."},
	{mOutboxMessages, "gauge", []string{"status"}, [][]string{outboxStatuses}, sourceOutbox,
		"Outbox rows by status from the relay's last stats snapshot: pending (the backlog) and failed. Absent until the first snapshot."},
	{mOutboxOldest, "gauge", nil, nil, sourceOutbox,
		"Age of the oldest pending outbox message at the relay's last stats snapshot (0 when none)."},
	{mPollErrors, "counter", []string{"source"}, [][]string{pollSources}, sourceCollector,
		"Failed polls of watched sources at scrape time: store (idem.Stater) or broker (broker.LagReporter)."},
}

func defOf(name string) metricDef {
	for _, d := range metricDefs {
		if d.name == name {
			return d
		}
	}
	panic("promidem: no metric " + name)
}
