package idem

import (
	"context"
	"sync"
	"time"
)

// bgCompleter keeps recording completions (and Fails) that the foreground
// gave up on, so that when the store comes back the record is completed
// before a redelivery can take the key over. The heartbeat keeps extending
// their leases meanwhile. One goroutine, started with the first entry and
// gone when none is left or at Close. An entry's Held stays in the guard's
// holding set until the entry is recorded or given up: this process does
// not claim a key whose effect it applied and is still recording.
type bgCompleter struct {
	g       *Guard
	budget  time.Duration // how long an entry is retried; <= 0: off
	mu      sync.Mutex
	queue   []*bgEntry
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
	bgCallTimeout = 5 * time.Second        // per store call
	bgBatchMax    = 256                    // completions per CompleteBatch call
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
			b.round(bgCallTimeout/5, nil, time.Now().Add(bgCloseWait/2))
			b.abandonAll()
			return
		case <-t.C:
		}
		if b.round(bgCallTimeout, stop, time.Time{}) {
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

// round tries every queued entry once, until quit closes or the deadline
// passes (zero: none), and drops those that are done or out of time. It
// reports whether any was recorded.
func (b *bgCompleter) round(timeout time.Duration, quit <-chan struct{}, deadline time.Time) bool {
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
	bc := g.bc
	// One entry first, as a probe: while the store is down a round costs
	// one call, however many entries wait.
	if b.settle(ops[:1], bc, timeout, quit, deadline) {
		b.settle(ops[1:], bc, timeout, quit, deadline)
	}
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
		}
	}
	clear(b.queue[len(q):])
	b.queue = q
	b.mu.Unlock()
	return recorded
}

// settle makes one try at each of ops, every store call with a timeout of
// its own, and stops at the first call the store did not answer (down or
// too slow: the next round tries again), when quit closes or at deadline
// (zero: none). It reports whether it went through all of them. A round may hold thousands of entries: with one
// deadline for the round, a store answering in 25ms spent it reading
// records back, and every completion of the round was refused at once
// (TestBackgroundSlowStoreRecordsAll: 23 of 300 recorded in 2 minutes).
// A Complete is not read back first: it is idempotent per token (Store),
// so sending it again is its own read-back.
func (b *bgCompleter) settle(ops []*settleOp, bc BatchCompleter, timeout time.Duration, quit <-chan struct{}, deadline time.Time) bool {
	g := b.g
	call := func(f func(context.Context)) bool {
		select {
		case <-quit:
			return false
		default:
		}
		end := time.Now().Add(timeout)
		if !deadline.IsZero() {
			if !time.Now().Before(deadline) {
				return false
			}
			if deadline.Before(end) {
				end = deadline
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), end)
		defer cancel()
		f(ctx)
		return true
	}
	answered := func(op *settleOp) bool {
		return op.done || !retryable(op.err)
	}
	var batch []*settleOp
	for i, op := range ops {
		if op.done {
			continue
		}
		if op.action == SettleComplete {
			op.unknown = false
		}
		if op.unknown {
			if !call(func(ctx context.Context) { g.readBack(ctx, ops[i:i+1]) }) || op.unknown {
				return false // not read: the store did not answer
			}
			if op.done {
				continue
			}
		}
		if bc != nil && op.action == SettleComplete {
			batch = append(batch, op)
			if len(batch) < bgBatchMax {
				continue
			}
			if !call(func(ctx context.Context) { g.settleRound(ctx, batch, bc) }) || !answered(batch[0]) {
				return false
			}
			batch = batch[:0]
			continue
		}
		if !call(func(ctx context.Context) { g.settleRound(ctx, ops[i:i+1], nil) }) || !answered(op) {
			return false
		}
	}
	if len(batch) > 0 {
		return call(func(ctx context.Context) { g.settleRound(ctx, batch, bc) }) && answered(batch[0])
	}
	return true
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
