package idem

import (
	"context"
	"time"
)

// Hook is an observer of a Guard. It implements any of the interfaces below;
// the guard sorts hooks by interface once, at NewGuard. Hooks run inline on
// the caller's goroutine and must be fast and must not block.
type Hook any

// ClaimEvent describes one claim.
type ClaimEvent struct {
	Key      []byte
	Outcome  Outcome // zero when Err is set
	Attempts int
	Err      error
	Duration time.Duration // time spent in the store
}

// ClaimHook observes every claim, including each entry of a batch.
type ClaimHook interface {
	OnClaim(ctx context.Context, e ClaimEvent)
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

// SettleEvent describes the end of a held claim.
type SettleEvent struct {
	Key      []byte
	Token    uint64
	Action   SettleAction
	Err      error         // the store's answer; nil when recorded
	Held     time.Duration // from the claim to the settle
	Duration time.Duration // time spent in the store
}

// SettleHook observes Complete, Release and Fail of held claims.
type SettleHook interface {
	OnSettle(ctx context.Context, e SettleEvent)
}

// FailOpenHook observes each handler run let through without a record
// because the store failed (only with WithFailOpen).
type FailOpenHook interface {
	OnFailOpen(ctx context.Context, key []byte, err error)
}

// LeaseLostHook observes a held claim that was taken over or removed while
// its handler ran (found by the heartbeat or at settle).
type LeaseLostHook interface {
	OnLeaseLost(ctx context.Context, key []byte, token uint64, err error)
}

type hookSet struct {
	claim    []ClaimHook
	settle   []SettleHook
	failOpen []FailOpenHook
	lost     []LeaseLostHook
}

func newHookSet(hs []Hook) hookSet {
	var s hookSet
	for _, h := range hs {
		if x, ok := h.(ClaimHook); ok {
			s.claim = append(s.claim, x)
		}
		if x, ok := h.(SettleHook); ok {
			s.settle = append(s.settle, x)
		}
		if x, ok := h.(FailOpenHook); ok {
			s.failOpen = append(s.failOpen, x)
		}
		if x, ok := h.(LeaseLostHook); ok {
			s.lost = append(s.lost, x)
		}
	}
	return s
}

func (s *hookSet) timed() bool { return len(s.claim) > 0 || len(s.settle) > 0 }
