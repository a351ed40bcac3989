package consumer

import (
	"errors"
	"time"

	"github.com/idem-dev/idem"
)

// ClaimOutcome maps a transactional handler's claim of one item onto what
// the runtime needs: c and err as the store's ClaimTx returned them (or one
// entry of ClaimBatchTx: its Claim and Err). acquired reports that the
// item's key is now held by the transaction: apply its effect and complete
// it (the item's outcome is then TxDone), or release or fail it. Otherwise
// o is the item's outcome, and nothing of the item's is in the
// transaction:
//
//   - already completed: TxDuplicate;
//   - held by someone else (OutcomeInProgress, idem.ErrInProgress):
//     TxInProgress after the holder's remaining lease (1s if unknown);
//   - failed for good (OutcomeFailed, idem.ErrFailed) or reused with
//     another payload (idem.ErrFingerprintMismatch): TxRejected;
//   - any other error: TxRetry with it (the runtime classifies it: a
//     database it cannot reach holds the message, spending no attempt).
//
// pgstore.TxHandler, pgstore.TxBatchHandler and mysqlstore's use it; it is
// exported for transactional handlers over other databases.
func ClaimOutcome(c idem.Claim, err error) (o TxOutcome, acquired bool) {
	var ip *idem.InProgressError
	switch {
	case errors.As(err, &ip):
		return TxOutcome{Status: TxInProgress, RetryAfter: ip.RetryAfter(time.Now())}, false
	case errors.Is(err, idem.ErrInProgress):
		return TxOutcome{Status: TxInProgress, RetryAfter: time.Second}, false
	case errors.Is(err, idem.ErrFailed), errors.Is(err, idem.ErrFingerprintMismatch):
		return TxOutcome{Status: TxRejected, Err: err}, false
	case err != nil:
		return TxOutcome{Status: TxRetry, Err: err}, false
	}
	switch c.Outcome {
	case idem.OutcomeAcquired:
		return TxOutcome{Status: TxDone}, true
	case idem.OutcomeCompleted:
		return TxOutcome{Status: TxDuplicate}, false
	case idem.OutcomeInProgress:
		return TxOutcome{Status: TxInProgress, RetryAfter: inProgressWait(c.Record)}, false
	case idem.OutcomeFailed:
		return TxOutcome{Status: TxRejected, Err: &idem.FailedError{Key: c.Record.Key, Cause: c.Record.LastError, Attempts: c.Record.Attempts}}, false
	}
	return TxOutcome{Status: TxRetry, Err: errors.New("consumer: claim with no outcome")}, false
}

// inProgressWait is how long to wait for the holder of rec: what is left
// of its lease, at least a millisecond; a second if unknown. LeaseUntil is
// on the store's clock, so the wait is bounded by the lease itself (from
// the record's last update to LeaseUntil, both on that clock; MaxLease if
// the record does not say): a store clock ahead of ours must not make it
// hours.
func inProgressWait(rec idem.Record) time.Duration {
	if rec.LeaseUntil.IsZero() {
		return time.Second
	}
	return idem.InProgressOf(&rec).RetryAfter(time.Now())
}
