package e2etest

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/broker"
)

// ChaosSub injects faults into a subscriber: every NakEvery-th first
// delivery has its Ack turned into Nak(0) (the effect is done but the ack
// is lost: F1/F4), and after Crash it behaves like a dead process: nothing
// it settles reaches the broker and Fetch fails with broker.ErrClosed.
type ChaosSub struct {
	broker.Subscriber
	NakEvery int64 // 0: no forced naks

	n       atomic.Int64
	forced  atomic.Int64
	crashed atomic.Bool
}

// Fetch wraps each delivery's Acker.
func (s *ChaosSub) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if s.crashed.Load() {
		return nil, broker.ErrClosed
	}
	msgs, err := s.Subscriber.Fetch(ctx, max)
	for _, m := range msgs {
		a := &chaosAcker{Acker: m.Acker, s: s}
		if m.Delivery == 1 && s.NakEvery > 0 && s.n.Add(1)%s.NakEvery == 0 {
			a.nakInstead = true
		}
		m.Acker = a
	}
	return msgs, err
}

// Crash: from now on nothing this subscriber settles reaches the broker.
func (s *ChaosSub) Crash() { s.crashed.Store(true) }

// Forced is how many acks were turned into naks.
func (s *ChaosSub) Forced() int64 { return s.forced.Load() }

type chaosAcker struct {
	broker.Acker
	s          *ChaosSub
	nakInstead bool
}

func (a *chaosAcker) Ack(ctx context.Context) error {
	if a.s.crashed.Load() {
		return nil // lost with the process
	}
	if a.nakInstead {
		a.s.forced.Add(1)
		return a.Acker.Nak(ctx, 0)
	}
	return a.Acker.Ack(ctx)
}

func (a *chaosAcker) Nak(ctx context.Context, d time.Duration) error {
	if a.s.crashed.Load() {
		return nil
	}
	return a.Acker.Nak(ctx, d)
}

func (a *chaosAcker) Term(ctx context.Context, reason string) error {
	if a.s.crashed.Load() {
		return nil
	}
	return a.Acker.Term(ctx, reason)
}
