package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Settling: Complete, Release and Fail of held claims.
//
// A held claim keeps its heartbeat until the store has recorded how it
// ended (or refused it for good: ErrFenced, ErrNotFound, an invalid
// argument), so its lease never lapses while a settle is being retried.
// The foreground retries with backoff for at most one lease from its first
// try and never past the end of the lease as last extended (when the store
// is down the heartbeat cannot extend it either), then the caller gets
// ErrUnrecorded and a Complete or Fail goes on in the background
// (WithBackgroundRetry).

// settleOp is one held claim being settled.
//
// It lives inside its Held (one allocation per claim), so its fields are
// laid out to waste no padding: a batch consumer makes a Held per message.
type settleOp struct {
	h        *Held
	result   []byte
	cause    string
	tooLarge int   // > 0: a Complete turned into a Fail: the result had this many bytes
	err      error // the store's latest answer; nil once recorded
	start    time.Time

	tries   int32
	action  SettleAction
	unknown bool // err may have been applied: read the record before retrying
	done    bool // recorded, or refused for good
}

// newOp readies the Held's own settleOp (a Held settles once; keeping the
// op inside it saves an allocation on the hot path).
func (h *Held) newOp(a SettleAction, result []byte, cause string) *settleOp {
	h.op = settleOp{h: h, action: a, result: result, cause: cause}
	return &h.op
}

func (h *Held) completeOp(result []byte) *settleOp {
	if n := len(result); n > MaxResultLen {
		// The effect ran: releasing would run it again on every retry.
		// Mark the key failed, saying why, so duplicates never re-run it.
		cause := fmt.Sprintf("effect done; result of %d bytes exceeds MaxResultLen %d, not recorded", n, MaxResultLen)
		op := h.newOp(SettleFail, nil, cause)
		op.tooLarge = n
		return op
	}
	return h.newOp(SettleComplete, result, "")
}

// target is the state that shows the op was applied with its token.
func (op *settleOp) target() State {
	switch op.action {
	case SettleComplete:
		return StateCompleted
	case SettleRelease:
		return StateReleased
	}
	return StateFailed
}

// answer records one store answer.
func (op *settleOp) answer(err error) {
	op.tries++
	op.err = err
	op.unknown = false
	switch {
	case err == nil, !retryable(err):
		op.done = true
	default:
		op.unknown = !(errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrUnknownOutcome))
	}
}

func retryable(err error) bool {
	return !errors.Is(err, ErrFenced) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalidKey) &&
		!errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrClosed)
}

// windowEnd is when the foreground stops retrying op: one lease after its
// first try, and never past the lease as last extended.
func (op *settleOp) windowEnd() time.Time {
	end := op.start.Add(op.h.lease)
	if le := op.h.leaseEnd(); le.Before(end) {
		end = le
	}
	return end
}

// Backoff between settle rounds: from settleBackoffMin doubling up to an
// eighth of the lease (at most settleBackoffMax), so a short lease still
// gets several tries.
const (
	settleBackoffMin = 10 * time.Millisecond
	settleBackoffMax = time.Second
)

func clampDur(d, lo, hi time.Duration) time.Duration { return max(lo, min(d, hi)) }

// settleNow settles ops in the foreground (see the comment at the top).
// bc, when set, completes the SettleComplete ops in one call per round.
func (g *Guard) settleNow(ctx context.Context, ops []*settleOp, bc BatchCompleter) {
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx) // recording the outcome matters more than a shutdown
	}
	now := g.cfg.clock.Now()
	minLease := MaxLease
	for _, op := range ops {
		op.h.beginSettle()
		op.start = now
		minLease = min(minLease, op.h.lease)
		if g.beats == nil && op.action != SettleRelease {
			// With the heartbeat on the claim is in the holding set
			// already; with it off (leases alone keep claims apart) from
			// here: the effect is done (or its failure decided) and this
			// process must not run it again while it records that.
			g.holding.add(op.h)
		}
	}
	backoffMax := clampDur(minLease/8, time.Millisecond, settleBackoffMax)
	backoff := min(settleBackoffMin, backoffMax)
	floor := clampDur(minLease/4, time.Millisecond, 250*time.Millisecond)
	var buf [4]*settleOp
	live := buf[:0]
	var sc *settleScratch
	if len(ops) > len(buf) {
		sc = getSettleScratch()
		sc.ops = slices.Grow(sc.ops[:0], len(ops))[:len(ops)]
		live = sc.ops[:0] // never grown past it: live is a subset of ops
	}
	for round := 0; ; round++ {
		live = live[:0]
		wall := time.Now() // read before the guard's clock: deadlines err early, never late
		now = g.cfg.clock.Now()
		var end time.Time
		for _, op := range ops {
			if op.done {
				continue
			}
			e := op.windowEnd()
			// A retry needs at least floor before the window ends, so that
			// no call runs past it; a first try is always made (a lapsed
			// lease may still be completed if nobody took over).
			if op.tries > 0 && (e.Sub(now) < floor || g.cfg.completeRetries > 0 && int(op.tries) > g.cfg.completeRetries) {
				continue // out of time: unrecorded
			}
			if end.IsZero() || e.Before(end) {
				end = e
			}
			live = append(live, op)
		}
		if len(live) == 0 {
			// All done, or out of time. A last read resolves those whose
			// outcome is unknown (applied after all, or taken over); it
			// changes nothing, so it may run past the window.
			if sc != nil {
				sc.put()
			}
			if anyUnknown(ops) {
				rctx := ops[0].roundCtx(round, ctx, wall.Add(floor))
				g.readBack(rctx, ops)
				rctx.release()
			}
			return
		}
		rctx := ops[0].roundCtx(round, ctx, wall.Add(max(end.Sub(now), floor)))
		g.readBack(rctx, live)
		g.settleRound(rctx, live, bc)
		rctx.release()
		if allDone(live) {
			continue
		}
		wait := backoff
		if rem := end.Sub(g.cfg.clock.Now()) - floor; rem < wait {
			wait = rem // then the op whose window ends first leaves
		}
		if !sleepFor(wait) {
			continue
		}
		backoff = min(backoff*2, backoffMax)
	}
}

// anyUnknown reports whether readBack has anything to read in ops.
func anyUnknown(ops []*settleOp) bool {
	for _, op := range ops {
		if !op.done && op.unknown {
			return true
		}
	}
	return false
}

func allDone(ops []*settleOp) bool {
	for _, op := range ops {
		if !op.done {
			return false
		}
	}
	return true
}

// sleepFor sleeps d and reports whether it slept at all.
func sleepFor(d time.Duration) bool {
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	<-t.C
	return true
}

// readBack reads the record of each op whose last answer left the outcome
// unknown (invariant 5): applied with our token -> recorded; another token
// -> fenced. It stops at the first read the store could not serve.
func (g *Guard) readBack(ctx context.Context, ops []*settleOp) {
	for _, op := range ops {
		if op.done || !op.unknown {
			continue
		}
		h := op.h
		rec, err := g.store.Get(ctx, h.key)
		switch {
		case errors.Is(err, ErrNotFound):
			op.err, op.done = err, true
		case err != nil:
			return
		case rec.Token != h.token:
			op.err = fmt.Errorf("%w: key %q taken over (token %d, current %d)", ErrFenced, truncKey(h.key), h.token, rec.Token)
			op.done = true
		case rec.State == op.target():
			op.err, op.done = nil, true
		}
		op.unknown = false
	}
}

// settleRound makes one store call for each op not done (one call for all
// the completions when bc is set).
func (g *Guard) settleRound(ctx context.Context, ops []*settleOp, bc BatchCompleter) {
	var cs []Completion
	var batched []*settleOp
	if bc != nil && len(ops) > 1 {
		sc := getSettleScratch()
		cs, batched = slices.Grow(sc.cs[:0], len(ops)), slices.Grow(sc.ops[:0], len(ops))
		defer sc.keep(&cs, &batched)
	}
	for _, op := range ops {
		if op.done {
			continue
		}
		if bc != nil && op.action == SettleComplete {
			cs = append(cs, Completion{Key: op.h.key, Token: op.h.token, Result: op.result})
			batched = append(batched, op)
			continue
		}
		h := op.h
		var start time.Time
		if len(g.hooks.settle) > 0 {
			start = g.cfg.clock.Now()
		}
		var err error
		switch op.action {
		case SettleComplete:
			err = g.store.Complete(ctx, h.key, h.token, op.result)
		case SettleRelease:
			err = g.store.Release(ctx, h.key, h.token, op.cause)
		case SettleFail:
			err = g.store.Fail(ctx, h.key, h.token, op.cause)
		}
		h.onSettle(ctx, op.action, err, start)
		op.answer(err)
	}
	if len(cs) == 0 {
		return
	}
	var start time.Time
	if len(g.hooks.settle) > 0 {
		start = g.cfg.clock.Now()
	}
	res, err := bc.CompleteBatch(ctx, cs)
	if err == nil && len(res) != len(cs) {
		err = fmt.Errorf("%w: store answered %d of %d completions", ErrUnknownOutcome, len(res), len(cs))
	}
	for j, op := range batched {
		e := err
		if e == nil {
			e = res[j]
		}
		op.h.onSettle(ctx, SettleComplete, e, start)
		op.answer(e)
	}
}

// settleScratch is the working lists of a batch settle, reused from
// batch to batch (a batch's settle made four lists of its size: its ops,
// their index in the caller's list, the round's live ops, the
// completions sent to the store). Each user takes the lists it needs and
// gives them back grown.
type settleScratch struct {
	ops []*settleOp
	idx []int
	cs  []Completion
}

var settleScratchPool = sync.Pool{New: func() any { return new(settleScratch) }}

func getSettleScratch() *settleScratch { return settleScratchPool.Get().(*settleScratch) }

// keep returns sc to the pool with the lists a settle round used.
func (sc *settleScratch) keep(cs *[]Completion, ops *[]*settleOp) {
	sc.cs, sc.ops = *cs, *ops
	sc.put()
}

// put returns sc to the pool, keeping no claim or key alive: what the
// lists held up to their length is cleared.
func (sc *settleScratch) put() {
	clear(sc.ops)
	clear(sc.cs)
	sc.ops, sc.idx, sc.cs = sc.ops[:0], sc.idx[:0], sc.cs[:0]
	settleScratchPool.Put(sc)
}

// finish ends the foreground part of op and returns what the caller gets.
// An unrecorded Complete or Fail is handed to the background completer;
// everything else stops the heartbeat here.
func (g *Guard) finish(ctx context.Context, op *settleOp, background bool) error {
	h := op.h
	if !op.done {
		if op.action == SettleRelease {
			// The lease lapsing does what the release would have done.
			h.stopHeartbeat()
			return fmt.Errorf("idem: release %q: %w", truncKey(h.key), op.err)
		}
		var err error
		// Logged after the hand-over is known: the background may be off
		// (WithBackgroundRetry < 0), full or closed. Fields are read before
		// it, which owns op from then on.
		tries, lastErr := op.tries, op.err
		what := "effect done but its completion could not be recorded"
		if op.effectDone() {
			err = fmt.Errorf("%w: key %q: %w", ErrUnrecorded, truncKey(h.key), op.err)
			if op.tooLarge > 0 {
				err = fmt.Errorf("%w: %w", op.tooLargeErr(), err)
			}
		} else {
			// A handler failed for good and the store did not record it:
			// keep trying so that the lease lapsing does not run it again.
			what = "could not mark a key failed"
			err = fmt.Errorf("idem: mark %q failed: %w", truncKey(h.key), op.err)
		}
		g.unrecorded(ctx, op, UnrecordedPending)
		// From here on the background completer owns op.
		if background && g.bg.add(ctx, op) {
			g.log.Error("idem: "+what+"; retrying in the background",
				"key", string(truncKey(h.key)), "token", h.token, "action", op.action, "tries", tries, "err", lastErr)
			return err
		}
		g.log.Error("idem: "+what+"; not retried (background retry is off, full or closed): the key may be claimed again once its lease lapses",
			"key", string(truncKey(h.key)), "token", h.token, "action", op.action, "tries", tries, "err", lastErr)
		h.stopHeartbeat()
		g.unrecorded(ctx, op, UnrecordedAbandoned)
		return err
	}
	g.settled(ctx, op)
	err := op.err
	switch {
	case err == nil && op.tooLarge > 0:
		return op.tooLargeErr()
	case err == nil:
		return nil
	case op.tooLarge > 0:
		return fmt.Errorf("%w: mark %q failed: %w", op.tooLargeErr(), truncKey(h.key), err)
	}
	switch op.action {
	case SettleComplete:
		return fmt.Errorf("idem: complete %q: %w", truncKey(h.key), err)
	case SettleRelease:
		return fmt.Errorf("idem: release %q: %w", truncKey(h.key), err)
	}
	return fmt.Errorf("idem: mark %q failed: %w", truncKey(h.key), err)
}

// settled stops the heartbeat of an op that is done, and reports a lost
// claim.
func (g *Guard) settled(ctx context.Context, op *settleOp) {
	op.h.stopHeartbeat()
	if errors.Is(op.err, ErrFenced) || errors.Is(op.err, ErrNotFound) {
		op.h.markLost(ctx, op.err)
	}
}

func (op *settleOp) tooLargeErr() error {
	return &ResultTooLargeError{Key: op.h.key, Len: op.tooLarge}
}

// effectDone: the handler's effect ran, so losing this settle may run it
// again.
func (op *settleOp) effectDone() bool { return op.action == SettleComplete || op.tooLarge > 0 }

// unrecorded reports op to Hooks.OnUnrecorded when its effect ran.
func (g *Guard) unrecorded(ctx context.Context, op *settleOp, phase UnrecordedPhase) {
	if len(g.hooks.unrecorded) == 0 || !op.effectDone() {
		return
	}
	e := UnrecordedEvent{Key: op.h.key, Token: op.h.token, Action: op.action, Phase: phase, Err: op.err,
		Tries: int(op.tries), Window: op.h.leaseEnd().Sub(g.cfg.clock.Now())}
	g.hooks.onUnrecorded(ctx, e)
}

// deadlineCtx is the context of one settle round: the values of the
// caller's context, none of its cancellation, and a deadline. The timer
// behind Done is made only when a store asks for Done (a network driver
// does; an in-memory store only checks Err), so the hot path pays no timer.
//
// A driver may keep using a round's context after the round, from a
// goroutine of its own (database/sql and go-sql-driver watch a query's
// context until its rows are closed, and store ctx.Err() once Done is
// closed): so a context is never reused for another round, and once
// released it stays done (Done closed, Err non-nil) for good.
type deadlineCtx struct {
	parent   context.Context // not cancellable
	deadline time.Time       // wall clock
	mu       sync.Mutex
	ctx      context.Context // made on demand by Done
	cancel   context.CancelFunc
	released bool
}

// roundCtx is the context of settle round n of ops whose first is op: for
// the first round of a single claim, the one made with its Held (see
// heldAlone: Complete allocates nothing); otherwise a new one (a batch
// settle makes one per round, not one per claim).
func (op *settleOp) roundCtx(n int, parent context.Context, deadline time.Time) *deadlineCtx {
	c := op.h.rc
	if c == nil || n > 0 || c.parent != nil {
		c = new(deadlineCtx)
	}
	c.parent, c.deadline = parent, deadline
	return c
}

// release ends the round: the timer, if one was made, is stopped, and the
// context is done from now on.
func (c *deadlineCtx) release() {
	c.mu.Lock()
	c.released = true
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
}

func (c *deadlineCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		if c.released {
			return closedChan
		}
		c.ctx, c.cancel = context.WithDeadline(c.parent, c.deadline)
	}
	return c.ctx.Done()
}

// closedChan is Done of a round context released before anyone asked.
var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

func (c *deadlineCtx) Err() error {
	c.mu.Lock()
	inner, deadline, released := c.ctx, c.deadline, c.released
	c.mu.Unlock()
	if inner != nil {
		return inner.Err()
	}
	if released {
		return context.Canceled
	}
	if !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *deadlineCtx) Value(k any) any {
	c.mu.Lock()
	inner, parent := c.ctx, c.parent
	c.mu.Unlock()
	if inner != nil {
		return inner.Value(k) // lets context.WithX find the timer's cancelCtx
	}
	return parent.Value(k)
}
