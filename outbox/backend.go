package outbox

import (
	"context"
	"sync"
	"time"
)

// Backend is an outbox table, seen from the relay and from operators.
// Writing into it is backend-specific, because it happens inside the
// caller's transaction (pgoutbox.Outbox.Enqueue takes a pgx.Tx,
// mysqloutbox a *sql.Tx, boltoutbox a *bbolt.Tx); every Enqueue goes
// through Prepare and stores the message as StatusPending with Attempts 0,
// NextAttemptAt = CreatedAt = the backend's clock, and a Seq larger than
// every Seq the backend handed out before. A message whose ID is already
// stored fails with ErrDuplicateID. The message exists for the relay when,
// and only if, the caller's transaction commits.
//
// Implementations are safe for concurrent use by many goroutines and, for
// the SQL backends, many processes. Times given as zero mean the backend's
// own clock (the database server's); the relay passes its clock's time only
// when one is injected, so that a relay host whose clock is behind the
// database does not delay fresh messages.
//
// Claim is the relay's half:
//
//   - It returns up to req.Limit rows with StatusPending and NextAttemptAt
//     <= req.Now, in (NextAttemptAt, Seq) order, and holds them until the
//     batch is settled or released, or until the claimer is gone (its
//     process died, its connection was lost): the backend frees them then,
//     unchanged. A row held by one batch is never in another (on SQL: FOR
//     UPDATE SKIP LOCKED), so any number of relays may claim at once and
//     none waits for another's batch.
//   - It never remembers a position: every claim looks at every due row,
//     because rows commit out of Seq order (a transaction that took Seq 10
//     may commit after the one that took Seq 11).
//   - With req.Ordered, a row is returned only when no row with the same
//     non-empty Key and a smaller Seq is pending (due or not, held by a
//     batch or not): a key's later message waits until the earlier one is
//     sent or failed. Rows with an empty Key are not ordered.
//   - A claim that finds nothing returns an empty batch (Settle and Release
//     are no-ops on it).
//   - A stored row that cannot be read as a message (its headers do not
//     decode) is returned with Row.Bad set, never made an error of the
//     claim: one such row must not stop every relay. ListFailed does the
//     same.
//
// PurgeSent removes up to limit rows with StatusSent whose UpdatedAt is
// before before, in small statements, skipping rows another purge holds,
// and returns how many it removed. Pending and failed rows are never
// purged.
//
// Stats counts pending and failed rows and reads the oldest pending row's
// CreatedAt.
//
// ListFailed returns up to limit rows with StatusFailed and Seq > afterSeq,
// in Seq order (an operator's page walk; a row failed after the walk passed
// its Seq is seen on the next walk). Requeue turns the failed rows among
// ids back into pending rows due now with Attempts 0 (LastError is kept) and
// returns how many it changed; ids that are not failed are left alone.
type Backend interface {
	Claim(ctx context.Context, req ClaimRequest) (Batch, error)
	PurgeSent(ctx context.Context, before time.Time, limit int) (int, error)
	Stats(ctx context.Context) (Stats, error)
	ListFailed(ctx context.Context, afterSeq int64, limit int) ([]Row, error)
	Requeue(ctx context.Context, ids []string) (int, error)
}

// ClaimRequest asks for due rows.
type ClaimRequest struct {
	Limit   int       // at least 1
	Now     time.Time // zero: the backend's clock
	Ordered bool      // per-key order: only the earliest pending row of each key
	// Hold is the longest the claimer means to leave the batch without a
	// word to the backend (publishing it); zero: no bound. A backend that
	// can bounds the claim by it, so that a claimer gone without closing
	// its connection (host power loss, network partition, a frozen
	// process) frees its rows soon after, not when TCP keepalive gives up:
	// pgoutbox and mysqloutbox (MariaDB) end the claim's session when its
	// transaction stays idle longer. A claimer slower than its Hold loses the claim (Settle
	// fails), like one that died.
	Hold time.Duration
}

// Batch is a claim: rows held until Settle or Release.
//
// Settle records what happened to rows of the batch and ends it, in one
// atomic step: every row in s.Sent becomes StatusSent, every row in s.Retry
// stays pending with NextAttemptAt = s.Now + Delay and LastError = Err,
// every row in s.Failed becomes StatusFailed with LastError = Err; each of
// them gets Attempts+1 and UpdatedAt = s.Now. Rows of the batch not named
// are freed unchanged. Err may be any text (a broker client's message,
// NUL bytes and invalid UTF-8 included): the backend stores
// TruncateError(Err), never fails for it. A Seq that is not in the batch, or named twice, is
// idem.ErrInvalidArgument and nothing changes; a second Settle is
// ErrBatchEnded. When Settle fails the rows are freed unchanged (or, when
// the outcome is unknown, maybe settled): a published row is then
// published again, which the broker's dedup and the consumer's guard absorb.
//
// Release frees every row of the batch unchanged (no attempt counted) and
// ends it; after Settle or Release it is a no-op, so it can be deferred.
type Batch interface {
	Rows() []Row
	Settle(ctx context.Context, s Settlement) error
	Release(ctx context.Context) error
}

// Settlement is the outcome of publishing a batch.
type Settlement struct {
	Now    time.Time // zero: the backend's clock
	Sent   []int64   // Seqs published
	Retry  []Retry
	Failed []Failure
}

// Len is the number of rows s names.
func (s Settlement) Len() int { return len(s.Sent) + len(s.Retry) + len(s.Failed) }

// Check returns idem.ErrInvalidArgument unless every Seq s names is in the
// batch (inBatch) and named once, as Batch.Settle requires; backends call
// it before changing anything.
func (s Settlement) Check(inBatch func(seq int64) bool) error {
	seen := make(map[int64]struct{}, s.Len())
	check := func(seq int64) error {
		if !inBatch(seq) {
			return invalid("settle: seq %d is not in the batch", seq)
		}
		if _, dup := seen[seq]; dup {
			return invalid("settle: seq %d named twice", seq)
		}
		seen[seq] = struct{}{}
		return nil
	}
	for _, seq := range s.Sent {
		if err := check(seq); err != nil {
			return err
		}
	}
	for _, r := range s.Retry {
		if err := check(r.Seq); err != nil {
			return err
		}
	}
	for _, f := range s.Failed {
		if err := check(f.Seq); err != nil {
			return err
		}
	}
	return nil
}

// Retry reschedules a row after a failed attempt.
type Retry struct {
	Seq   int64
	Delay time.Duration // NextAttemptAt = Now + Delay
	Err   string        // stored in LastError (TruncateError)
}

// Failure marks a row failed after its last attempt.
type Failure struct {
	Seq int64
	Err string
}

// Stats is a snapshot of the outbox, for metrics and alerts.
type Stats struct {
	Pending       int64     // backlog: pending rows, due or not
	Failed        int64     // rows waiting for an operator
	OldestPending time.Time // CreatedAt of the oldest pending row; zero when none
	At            time.Time // the backend's clock when counted
}

// OldestAge is how long the oldest pending row has waited (0 when none),
// measured on the backend's clock.
func (s Stats) OldestAge() time.Duration {
	if s.OldestPending.IsZero() {
		return 0
	}
	return max(s.At.Sub(s.OldestPending), 0)
}

// Notifier is an optional Backend capability: Listen calls wake soon after
// a transaction that enqueued messages commits (PostgreSQL LISTEN/NOTIFY),
// so the relay need not poll often. It blocks until ctx is done (then it
// returns nil) or the notification channel fails for good; it reconnects
// after transient failures and calls wake after each reconnect, since
// notifications sent meanwhile are lost.
//
// A backend whose notifications can be switched off also has a method
// Notifies() bool; the relay listens, and polls only as a safety net, when
// it reports true.
type Notifier interface {
	Listen(ctx context.Context, wake func()) error
}

// notifierOf returns b's Notifier when b sends notifications.
func notifierOf(b Backend) Notifier {
	n, ok := b.(Notifier)
	if !ok {
		return nil
	}
	if s, ok := b.(interface{ Notifies() bool }); ok && !s.Notifies() {
		return nil
	}
	return n
}

// RequeueFailed re-queues every failed row of b (an operator's "retry all
// after the fix"), walking ListFailed in pages of page rows, and returns
// how many it re-queued. Rows failing while it runs may be left for the
// next call.
func RequeueFailed(ctx context.Context, b Backend, page int) (int, error) {
	if page < 1 {
		return 0, invalid("requeue: page %d < 1", page)
	}
	total := 0
	for after := int64(0); ; {
		rows, err := b.ListFailed(ctx, after, page)
		if err != nil || len(rows) == 0 {
			return total, err
		}
		ids := make([]string, len(rows))
		for i, r := range rows {
			ids[i] = r.ID
		}
		n, err := b.Requeue(ctx, ids)
		total += n
		if err != nil {
			return total, err
		}
		after = rows[len(rows)-1].Seq
	}
}

// Wakers is the Notifier of in-process backends (memoutbox, boltoutbox):
// Listen keeps wake registered until ctx ends, Wake calls every registered
// function. Embed it to implement Notifier. The zero value is ready.
type Wakers struct {
	mu   sync.Mutex
	next int
	m    map[int]func()
}

// Listen implements Notifier.
func (w *Wakers) Listen(ctx context.Context, wake func()) error {
	w.mu.Lock()
	if w.m == nil {
		w.m = map[int]func(){}
	}
	w.next++
	id := w.next
	w.m[id] = wake
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
	return nil
}

// Wake calls every registered wake function (outside the lock).
func (w *Wakers) Wake() {
	w.mu.Lock()
	fs := make([]func(), 0, len(w.m))
	for _, f := range w.m {
		fs = append(fs, f)
	}
	w.mu.Unlock()
	for _, f := range fs {
		f()
	}
}
