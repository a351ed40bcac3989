package idem

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"
)

// Hooks observe a Guard. Each field is optional (nil fields are skipped);
// the guard keeps the non-nil ones at NewGuard. Hooks run inline on the
// goroutine that caused the event (a caller, the heartbeat or the
// background completer) and must be fast and must not block. A hook that
// panics is logged with its stack and otherwise ignored.
//
// A struct of funcs rather than interfaces found by type assertion: a
// misspelled field does not compile, where a misspelled method compiled
// and observed nothing.
type Hooks struct {
	// OnClaim observes every claim, including each entry of a batch.
	OnClaim func(ctx context.Context, e ClaimEvent)
	// OnSettle observes each store call that settles a held claim
	// (Complete, Release, Fail), retries included.
	OnSettle func(ctx context.Context, e SettleEvent)
	// OnFailOpen observes each handler run let through without a record
	// because the store could not be reached (only with WithFailOpen).
	OnFailOpen func(ctx context.Context, key []byte, err error)
	// OnLeaseLost observes a held claim that was taken over or removed
	// while held (found by the heartbeat or at settle).
	OnLeaseLost func(ctx context.Context, key []byte, token uint64, err error)
	// OnUnrecorded observes a completion the store did not record in time:
	// the caller got ErrUnrecorded (Phase UnrecordedPending), and later how
	// the guard's background retries ended (UnrecordedRecovered or
	// UnrecordedAbandoned). Count pending minus recovered to alert on
	// effects that may run again.
	OnUnrecorded func(ctx context.Context, e UnrecordedEvent)
}

// ClaimEvent describes one claim.
type ClaimEvent struct {
	Key      []byte
	Outcome  Outcome // zero when Err is set
	Attempts int
	Err      error
	Duration time.Duration // time spent in the store
}

// SettleAction is how a held claim ended.
type SettleAction uint8

const (
	SettleComplete SettleAction = iota + 1
	SettleRelease
	SettleFail
)

func (a SettleAction) String() string {
	switch a {
	case SettleComplete:
		return "complete"
	case SettleRelease:
		return "release"
	case SettleFail:
		return "fail"
	}
	return "unknown"
}

// SettleEvent describes one store call settling a held claim.
type SettleEvent struct {
	Key      []byte
	Token    uint64
	Action   SettleAction
	Err      error         // the store's answer; nil when recorded
	Held     time.Duration // from the claim to the settle
	Duration time.Duration // time spent in the store
}

// UnrecordedPhase says where an unrecorded completion stands.
type UnrecordedPhase uint8

const (
	// UnrecordedPending: the caller got ErrUnrecorded; the effect is done,
	// the record still says in progress, and the guard keeps retrying in
	// the background while the heartbeat keeps the lease.
	UnrecordedPending UnrecordedPhase = iota + 1
	// UnrecordedRecovered: a background retry recorded it. A redelivery
	// now replays the result.
	UnrecordedRecovered
	// UnrecordedAbandoned: the guard stopped trying (its background budget
	// ran out, its queue was full, the guard was closed, or the claim was
	// taken over meanwhile). Once the lease lapses a redelivery may run
	// the effect again.
	UnrecordedAbandoned
)

func (p UnrecordedPhase) String() string {
	switch p {
	case UnrecordedPending:
		return "pending"
	case UnrecordedRecovered:
		return "recovered"
	case UnrecordedAbandoned:
		return "abandoned"
	}
	return "unknown"
}

// UnrecordedEvent describes a completion the store did not record.
type UnrecordedEvent struct {
	Key    []byte
	Token  uint64
	Action SettleAction // SettleComplete, or SettleFail for a result too large
	Phase  UnrecordedPhase
	Err    error // the store's last answer (nil when recovered)
	Tries  int   // store calls made for this settle so far
	// Window is how long the lease was still known to run when the event
	// was raised (measured from the last successful claim or extend): the
	// time in which a redelivery is still refused as in progress. Zero or
	// negative: the lease may have lapsed already.
	Window time.Duration
}

type hookSet struct {
	claim      []func(context.Context, ClaimEvent)
	settle     []func(context.Context, SettleEvent)
	failOpen   []func(context.Context, []byte, error)
	lost       []func(context.Context, []byte, uint64, error)
	unrecorded []func(context.Context, UnrecordedEvent)
}

// newHookSet keeps the non-nil hooks, each wrapped so that a panic in it
// is logged (with its stack) and ignored: a hook runs on a caller's
// goroutine, the heartbeat's or the background completer's, where a panic
// would crash the process or leave a claim held until its lease lapses.
func newHookSet(hs []Hooks, log *slog.Logger) hookSet {
	var s hookSet
	for _, h := range hs {
		if f := h.OnClaim; f != nil {
			s.claim = append(s.claim, func(ctx context.Context, e ClaimEvent) {
				defer recoverHook(log, "OnClaim")
				f(ctx, e)
			})
		}
		if f := h.OnSettle; f != nil {
			s.settle = append(s.settle, func(ctx context.Context, e SettleEvent) {
				defer recoverHook(log, "OnSettle")
				f(ctx, e)
			})
		}
		if f := h.OnFailOpen; f != nil {
			s.failOpen = append(s.failOpen, func(ctx context.Context, key []byte, err error) {
				defer recoverHook(log, "OnFailOpen")
				f(ctx, key, err)
			})
		}
		if f := h.OnLeaseLost; f != nil {
			s.lost = append(s.lost, func(ctx context.Context, key []byte, token uint64, err error) {
				defer recoverHook(log, "OnLeaseLost")
				f(ctx, key, token, err)
			})
		}
		if f := h.OnUnrecorded; f != nil {
			s.unrecorded = append(s.unrecorded, func(ctx context.Context, e UnrecordedEvent) {
				defer recoverHook(log, "OnUnrecorded")
				f(ctx, e)
			})
		}
	}
	return s
}

// recoverHook, deferred around a hook, logs and swallows its panic.
func recoverHook(log *slog.Logger, name string) {
	if r := recover(); r != nil {
		log.Error("idem: hook panicked; ignored", "hook", name, "panic", r, "stack", string(debug.Stack()))
	}
}

func (s *hookSet) timed() bool { return len(s.claim) > 0 || len(s.settle) > 0 }

func (s *hookSet) onUnrecorded(ctx context.Context, e UnrecordedEvent) {
	for _, h := range s.unrecorded {
		h(ctx, e)
	}
}
