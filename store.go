package idem

import (
	"context"
	"time"
)

// State is the lifecycle state of a record.
type State uint8

const (
	// StateInProgress: a worker holds (or held, if LeaseUntil has passed)
	// the key. A live lease blocks other claims; an expired one may be
	// taken over.
	StateInProgress State = iota + 1
	// StateCompleted: the effect is done; Result holds the handler's answer.
	StateCompleted
	// StateFailed: terminal; LastError says why. Claims report OutcomeFailed
	// until the record's retention ends or it is deleted.
	StateFailed
	// StateReleased: the last holder gave the key back (its handler failed
	// or it shut down); the next claim acquires it.
	StateReleased
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	case StateReleased:
		return "released"
	}
	return "unknown"
}

// Outcome is the result of a claim.
type Outcome uint8

const (
	// OutcomeAcquired: the caller now holds the key with Record.Token.
	OutcomeAcquired Outcome = iota + 1
	// OutcomeCompleted: the key was already done; Record.Result is the
	// stored answer (a replay).
	OutcomeCompleted
	// OutcomeInProgress: another holder's lease is live until
	// Record.LeaseUntil.
	OutcomeInProgress
	// OutcomeFailed: the key is terminally failed; Record.LastError says why.
	OutcomeFailed
)

func (o Outcome) String() string {
	switch o {
	case OutcomeAcquired:
		return "acquired"
	case OutcomeCompleted:
		return "completed"
	case OutcomeInProgress:
		return "in_progress"
	case OutcomeFailed:
		return "failed"
	}
	return "unknown"
}

// Record is one idempotency record: one per (namespace, key).
type Record struct {
	Key         []byte
	State       State
	Token       uint64 // fencing token of the latest successful claim
	Fingerprint []byte // payload fingerprint of the first claim, if given
	Result      []byte // the handler's result once completed
	Attempts    int    // claims acquired since the record was created
	LastError   string // cause given to the latest Release or Fail
	LeaseUntil  time.Time
	ExpiresAt   time.Time // retention: after this the record is gone
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// ClaimRequest asks for one key.
type ClaimRequest struct {
	Key         []byte
	Fingerprint []byte        // optional; at most MaxFingerprintLen bytes
	Lease       time.Duration // how long the holder has before takeover
	TTL         time.Duration // retention after the claim or completion
}

// Claim is the outcome of a claim and the record as it stood after it.
type Claim struct {
	Outcome Outcome
	Record  Record
}

// Store is the idempotency record store. A Store value serves one namespace:
// records of different namespaces never see each other. Implementations must
// be safe for concurrent use by many goroutines and processes.
//
// Keys are raw bytes compared exactly (NUL, invalid UTF-8, case and trailing
// spaces are significant). Every method validates its arguments first
// (ValidateKey, ValidateClaim, ValidateToken, ...) and returns ErrInvalidKey or
// ErrInvalidArgument before any I/O. A method called with a context that is
// already done returns the context's error and changes nothing.
//
// A record whose ExpiresAt has passed is absent for every method, whether or
// not it has been purged yet.
//
// Claim is ONE atomic operation in the store (insert-if-absent, a
// conditional update, a script); never a read followed by a write. With now
// the store's clock:
//
//   - absent: create {InProgress, Token: new, Attempts: 1, Fingerprint,
//     LeaseUntil: now+Lease, ExpiresAt: max(now+TTL, LeaseUntil)} ->
//     OutcomeAcquired.
//   - present with a non-empty fingerprint that differs from a non-empty
//     requested one: ErrFingerprintMismatch, nothing changes.
//   - Completed: OutcomeCompleted with the stored Result, byte for byte.
//   - Failed: OutcomeFailed with LastError.
//   - InProgress with LeaseUntil > now: OutcomeInProgress.
//   - InProgress with an expired lease, or Released: take over: new Token,
//     Attempts+1, LeaseUntil and ExpiresAt as for a new record ->
//     OutcomeAcquired.
//
// A new token is strictly greater than every token issued before for the
// same key in the same namespace, including tokens of records since expired,
// purged or deleted (a per-store or per-shard counter does this; a per-record
// counter does not).
//
// Complete, Release, Fail and Extend present the token of a claim. If the
// record is absent they return ErrNotFound; if the token is not the record's
// current one, ErrFenced; neither changes anything. With the current token:
//
//   - Complete: InProgress (even past its lease, if nobody took over) ->
//     Completed with result, ExpiresAt = now+TTL of the claim. Repeating it on
//     a record already Completed with that token returns nil and keeps the
//     first result. Otherwise ErrFenced.
//   - Release: InProgress -> Released, LastError = cause when cause is not
//     empty. Repeating it on a record Released with that token returns nil.
//     Otherwise ErrFenced.
//   - Fail: InProgress -> Failed, LastError = cause, ExpiresAt = now+TTL of
//     the claim. Repeating it on a record Failed with that token returns nil.
//     Otherwise ErrFenced.
//   - Extend: InProgress -> LeaseUntil = now+lease, ExpiresAt raised to at
//     least LeaseUntil. Otherwise ErrFenced.
//
// Get returns the live record or ErrNotFound. Delete removes the record
// (admin eviction) and returns nil whether or not it existed; a later claim
// still gets a larger token.
//
// Errors other than the above are mapped onto ErrUnavailable (nothing was
// applied) or ErrUnknownOutcome (it may have been applied) where the store
// can tell; a caller treats any other error as unknown.
type Store interface {
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)
	Complete(ctx context.Context, key []byte, token uint64, result []byte) error
	Release(ctx context.Context, key []byte, token uint64, cause string) error
	Fail(ctx context.Context, key []byte, token uint64, cause string) error
	Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error
	Get(ctx context.Context, key []byte) (Record, error)
	Delete(ctx context.Context, key []byte) error
	Close() error
}

// BatchResult is one entry of a batch claim. Err is a per-key error
// (ErrInvalidKey, ErrInvalidArgument, ErrFingerprintMismatch, or ErrCorrupt
// for a stored record that cannot be decoded: that key alone fails, the
// other entries are applied); when it is set Claim is zero.
type BatchResult struct {
	Claim Claim
	Err   error
}

// BatchClaimer is an optional Store capability: claim many keys in one
// round-trip. Results are in request order and equal to claiming the keys
// one after another in that order: a key that appears twice is acquired by
// the first entry and reported in progress (or mismatched) for the second.
// An invalid entry gets its error in its BatchResult and the others proceed.
// A returned error means the whole batch failed (see ErrUnavailable and
// ErrUnknownOutcome); the results are then nil. reqs is the caller's again
// once ClaimBatch returns (the guard reuses it for its next batch): a
// store keeps no reference to the slice.
type BatchClaimer interface {
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]BatchResult, error)
}

// BatchClaimerInto is an optional capability of a BatchClaimer: ClaimBatch
// writing its results into out, which the caller provides with
// len(out) == len(reqs) (a store answers ErrInvalidArgument otherwise),
// instead of a slice the store makes. A batch consumer claims thousands of
// keys per batch, and a BatchResult is over 200 bytes: the guard reuses
// one out from batch to batch. Results, and what a returned error means,
// are ClaimBatch's; after an error out holds nothing of use. Neither
// slice is kept once the call returns. A wrapper that changes a store's
// ClaimBatch must change or hide this method too: the guard prefers it.
type BatchClaimerInto interface {
	ClaimBatchInto(ctx context.Context, reqs []ClaimRequest, out []BatchResult) error
}

// Completion is one entry of CompleteBatch.
type Completion struct {
	Key    []byte
	Token  uint64
	Result []byte
}

// BatchCompleter is an optional Store capability: complete many held claims
// in one round-trip (the settle half of a batch consumer, seed 000). Each
// entry is applied as Complete would apply it, independently of the others,
// and errs[i] is what Complete would have returned for cs[i] (nil,
// ErrFenced, ErrNotFound, ErrInvalidKey, ErrInvalidArgument, ErrCorrupt). A returned
// error means the call as a whole failed and any subset of it may have been
// applied; since Complete is idempotent per token, retrying is safe. cs
// is the caller's again once CompleteBatch returns (the guard reuses it):
// a store keeps no reference to the slice.
type BatchCompleter interface {
	CompleteBatch(ctx context.Context, cs []Completion) (errs []error, err error)
}

// Extension is one entry of ExtendBatch.
type Extension struct {
	Key   []byte
	Token uint64
	Lease time.Duration
}

// BatchExtender is an optional Store capability: extend the leases of many
// held claims in one round-trip (the guard's heartbeat sends every claim
// due in a tick this way, up to a few hundred per call, instead of one
// Extend per claim: a batch consumer holding thousands of keys otherwise
// spends a pool connection per key and tick). Each entry is applied as
// Extend would apply it, independently of the others, and errs[i] is what
// Extend would have returned for es[i] (nil, ErrFenced, ErrNotFound,
// ErrInvalidKey, ErrInvalidArgument, ErrCorrupt); an invalid entry fails
// alone. A key may appear more than once: its entries are applied in order.
// An empty call returns no errors and touches nothing. A returned error
// means the call as a whole failed and any subset of it may have been
// applied; an Extend applied twice only moves the lease again, so retrying
// is safe.
type BatchExtender interface {
	ExtendBatch(ctx context.Context, es []Extension) (errs []error, err error)
}

// ErrorClassifier is an optional Store capability: it maps an error from the store's
// driver, e.g. one returned by a handler whose effect used the same database (DoTx,
// ClaimTx), onto idem's sentinels: wrapped with ErrUnavailable (backend unreachable,
// nothing applied), with ErrUnknownOutcome (may have been applied), or returned
// unchanged (not an infrastructure error). nil stays nil.
//
// Implementations recognise their driver's own error types and codes (a
// connection-class SQLSTATE, a Redis LOADING reply, a closed pool) and fall
// back on ClassifyError for the rest. Callers holding a Store use its
// ErrorClassifier when it has one and ClassifyError otherwise.
type ErrorClassifier interface{ ClassifyError(err error) error }

// Purger is an optional Store capability: remove records past their
// retention. It removes at most limit records (limit <= 0: no limit) and
// reports how many it removed. It must not block claims for long: stores
// delete in small batches.
type Purger interface {
	Purge(ctx context.Context, limit int) (int, error)
}

// Lister is an optional Store capability: list records in StateInProgress
// (live or expired leases), for operators looking for stuck work. A page
// holds at most limit records (limit <= 0: the store's default page size);
// cursor is "" for the first page; the returned cursor is "" after the last
// page.
type Lister interface {
	ListInProgress(ctx context.Context, cursor string, limit int) ([]Record, string, error)
}

// Stats counts live records by state.
type Stats struct {
	InProgress int64
	Completed  int64
	Failed     int64
	Released   int64
}

// Total is the number of live records.
func (s Stats) Total() int64 { return s.InProgress + s.Completed + s.Failed + s.Released }

// Stater is an optional Store capability: count records by state. It may be
// approximate for records past retention but not yet purged.
type Stater interface {
	Stats(ctx context.Context) (Stats, error)
}

// Pinger is an optional Store capability: check that the backend answers
// (used for readiness).
type Pinger interface {
	Ping(ctx context.Context) error
}

// Clock tells the time. Stores that keep time themselves (Redis TIME,
// SQL now()) use the server's clock for leases so that all workers share one.
type Clock interface{ Now() time.Time }

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
