package idem

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// bgCompleter keeps recording completions (and Fails) that the foreground
// gave up on, so that when the store comes back the record is completed
// before a redelivery can take the key over. The heartbeat keeps extending
// their leases meanwhile. One goroutine, started with the first entry and
// gone when none is left or at Close.
type bgCompleter struct {
	g      *Guard
	budget time.Duration // how long an entry is retried; <= 0: off
	mu     sync.Mutex
	queue  []*bgEntry
	// pending counts the queued entries per key, so that this process
	// never claims a key whose effect it applied and is still recording
	// (see pendingFor); n is len(queue), read without the lock.
	pending map[string]int
	n       atomic.Int32
	running bool
	closed  bool
	stop    chan struct{}
	done    chan struct{}
}

type bgEntry struct {
	op     *settleOp
	ctx    context.Context
	giveUp time.Time
}

// Limits of the background completer.
const (
	bgQueueMax    = 4096                   // entries beyond it are abandoned at once
	bgBackoffMin  = 100 * time.Millisecond // first wait, and after a round that recorded something
	bgBackoffMax  = time.Second            // bounds the gap between the store coming back and the record completed
	bgCallTimeout = 5 * time.Second        // per round
	bgCloseWait   = 5 * time.Second        // Close waits at most this long
)

// add queues op; false when the completer is off, full or closed.
func (b *bgCompleter) add(ctx context.Context, op *settleOp) bool {
	if b == nil || b.budget <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.queue) >= bgQueueMax {
		return false
	}
	b.queue = append(b.queue, &bgEntry{op: op, ctx: context.WithoutCancel(ctx), giveUp: b.g.cfg.clock.Now().Add(b.budget)})
	if b.pending == nil {
		b.pending = make(map[string]int)
	}
	b.pending[string(op.h.key)]++
	b.n.Store(int32(len(b.queue)))
	if !b.running {
		b.running = true
		b.stop, b.done = make(chan struct{}), make(chan struct{})
		go b.loop(b.stop, b.done)
	}
	return true
}

func (b *bgCompleter) loop(stop, done chan struct{}) {
	defer close(done)
	backoff := bgBackoffMin
	for {
		t := time.NewTimer(backoff)
		select {
		case <-stop:
			t.Stop()
			b.round(bgCallTimeout / 5)
			b.abandonAll()
			return
		case <-t.C:
		}
		if b.round(bgCallTimeout) {
			backoff = bgBackoffMin
		} else {
			backoff = min(backoff*2, bgBackoffMax)
		}
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
}

// round tries every queued entry once and drops those that are done or out
// of time. It reports whether any was recorded.
func (b *bgCompleter) round(timeout time.Duration) bool {
	b.mu.Lock()
	entries := append([]*bgEntry(nil), b.queue...)
	b.mu.Unlock()
	if len(entries) == 0 {
		return false
	}
	g := b.g
	ops := make([]*settleOp, len(entries))
	for i, e := range entries {
		ops[i] = e.op
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	bc, _ := g.store.(BatchCompleter)
	// One entry first, as a probe: while the store is down a round costs
	// one call, however many entries wait.
	probe := ops[:1]
	g.readBack(ctx, probe)
	g.settleRound(ctx, probe, bc)
	if op := ops[0]; op.done || !errors.Is(op.err, ErrUnavailable) || errors.Is(op.err, ErrUnknownOutcome) {
		g.readBack(ctx, ops[1:])
		g.settleRound(ctx, ops[1:], bc)
	}
	cancel()
	now := g.cfg.clock.Now()
	recorded := false
	drop := make(map[*bgEntry]bool, len(entries))
	for _, e := range entries {
		drop[e] = true
		op := e.op
		switch {
		case op.done:
			g.settled(e.ctx, op)
			phase := UnrecordedRecovered
			if op.err != nil {
				phase = UnrecordedAbandoned
			} else {
				recorded = true
				g.log.Info("idem: recorded in the background", "key", string(truncKey(op.h.key)), "token", op.h.token, "action", op.action, "tries", op.tries)
			}
			g.unrecorded(e.ctx, op, phase)
		case !now.Before(e.giveUp):
			b.abandon(e)
		default:
			drop[e] = false
		}
	}
	b.mu.Lock()
	q := b.queue[:0]
	for _, e := range b.queue {
		if !drop[e] {
			q = append(q, e)
		} else {
			b.forget(e)
		}
	}
	clear(b.queue[len(q):])
	b.queue = q
	b.n.Store(int32(len(q)))
	b.mu.Unlock()
	return recorded
}

// forget drops e's key from pending; b.mu is held.
func (b *bgCompleter) forget(e *bgEntry) {
	k := string(e.op.h.key)
	if b.pending[k] <= 1 {
		delete(b.pending, k)
	} else {
		b.pending[k]--
	}
}

// anyPending reports whether any settle waits in the background.
func (b *bgCompleter) anyPending() bool { return b != nil && b.n.Load() > 0 }

// pendingFor reports whether a settle of key is still being recorded in
// the background. This process applied that key's effect (or decided its
// failure) and the store does not know yet; once the lease lapsed a claim
// would take the key over and run the effect again. The caller treats the
// key as in progress until the background has recorded the settle, or
// given up on it (fenced, abandoned).
func (b *bgCompleter) pendingFor(key []byte) bool {
	if !b.anyPending() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending[string(key)] > 0
}

func (b *bgCompleter) abandon(e *bgEntry) {
	op := e.op
	op.h.stopHeartbeat()
	b.g.log.Error("idem: gave up recording a settle; a redelivery after the lease may run the handler again",
		"key", string(truncKey(op.h.key)), "token", op.h.token, "action", op.action, "tries", op.tries, "err", op.err)
	b.g.unrecorded(e.ctx, op, UnrecordedAbandoned)
}

func (b *bgCompleter) abandonAll() {
	b.mu.Lock()
	q := b.queue
	b.queue = nil
	b.pending = nil
	b.n.Store(0)
	b.mu.Unlock()
	for _, e := range q {
		b.abandon(e)
	}
}

// close stops retrying: one last round, then whatever is left is
// abandoned. It waits at most bgCloseWait.
func (b *bgCompleter) close() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.closed = true
	running, stop, done := b.running, b.stop, b.done
	b.running = false
	b.mu.Unlock()
	if !running {
		return
	}
	close(stop)
	t := time.NewTimer(bgCloseWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		b.g.log.Error("idem: background completer did not stop in time (a store call ignores its context)")
	}
}
