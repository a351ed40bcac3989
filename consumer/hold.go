package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A hold is a delivery (or a group of a batch's deliveries) that the
// consumer keeps instead of settling it: its store could not be reached,
// its handler's system was unavailable, it is on its last broker delivery,
// or its dead-letter publish failed. A held delivery keeps its MaxInFlight
// slot and its InProgress signal (the broker does not redeliver it and no
// delivery is spent); its worker parks it under its order key, retries it
// later, and meanwhile goes on with other order keys. Later deliveries of
// the same order key wait behind it, so per-key order holds.
type hold struct {
	ds     []*delivery // the held deliveries (followers ride on them)
	reason HoldReason
	err    error
	// wait is the delay before the first retry; 0: the hold backoff
	// (Backoff, capped at StoreDownDelay).
	wait time.Duration
	// retry resumes the deliveries where they stopped. It returns what is
	// still held (nil: everything settled).
	retry func(ctx context.Context) []*hold
	// giveUp settles every delivery when the consumer stops: nak, or
	// dead-letter one on its last broker delivery. It must not hold.
	giveUp func(ctx context.Context)
	tries  int // retries so far that ended held again for the same reason
}

// holdDelay is the wait before retry number n of a hold without its own
// delay: the backoff, capped at StoreDownDelay, so a held delivery is
// retried at least that often.
func (c *Consumer) holdDelay(n int) time.Duration {
	return min(c.cfg.Backoff.Delay(n), c.cfg.StoreDownDelay)
}

// storeState tracks whether the guard's store is known to be down. While
// it is, held deliveries waiting for the store do not each retry: probes
// are spaced by the hold backoff consumer-wide, and the first store call
// that succeeds (a probe's or a new delivery's) wakes the others and ends
// the fetch pause.
type storeState struct {
	isDown    atomic.Bool
	nextProbe atomic.Int64 // unix nanos: no probe before then
	probes    atomic.Int64 // probes since the store went down
	mu        sync.Mutex
	up        chan struct{} // closed when the store answers again
}

// markDown records that the store failed.
func (s *storeState) markDown() {
	if s.isDown.Load() {
		return
	}
	s.mu.Lock()
	if !s.isDown.Load() {
		s.up = make(chan struct{})
		s.probes.Store(0)
		s.nextProbe.Store(0)
		s.isDown.Store(true)
	}
	s.mu.Unlock()
}

// markUp records that the store answered; it reports whether it was down.
func (s *storeState) markUp() bool {
	if !s.isDown.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.isDown.Load() {
		return false
	}
	s.isDown.Store(false)
	close(s.up)
	return true
}

// upCh is closed when the store answers again; nil while it is up.
func (s *storeState) upCh() <-chan struct{} {
	if !s.isDown.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.isDown.Load() {
		return nil
	}
	return s.up
}

// probe reports whether a held delivery may call the store now: always
// while the store is up; while it is down, once per hold backoff
// consumer-wide. Otherwise it says how long until the next probe.
func (c *Consumer) probe() (ok bool, wait time.Duration) {
	s := &c.store
	if !s.isDown.Load() {
		return true, 0
	}
	now := time.Now().UnixNano()
	next := s.nextProbe.Load()
	if now < next {
		return false, time.Duration(next - now)
	}
	d := c.holdDelay(int(s.probes.Load()))
	if !s.nextProbe.CompareAndSwap(next, now+int64(d)) {
		return false, d
	}
	s.probes.Add(1)
	return true, 0
}

// park is a hold parked in a worker.
type park struct {
	h       *hold
	lot     *lot     // its worker's
	keys    []string // order keys it blocks
	gen     uint64   // bumped on every (re)schedule; stale timer fires are ignored
	timer   *time.Timer
	lastTry time.Time
	gone    bool
}

// keyWait is one blocked order key: how many parks hold it and the
// deliveries that arrived behind them, in order.
type keyWait struct {
	parks   int
	waiting []*delivery
}

// lot collects parks whose retry time has come, from timer goroutines,
// for the worker's loop.
type lot struct {
	mu    sync.Mutex
	due   []lotEntry
	ready chan struct{}
}

type lotEntry struct {
	p    *park
	gen  uint64
	lost bool // pushed because a delivery of p was lost: due whatever gen
}

func newLot() *lot { return &lot{ready: make(chan struct{}, 1)} }

func (l *lot) push(p *park, gen uint64) { l.add(lotEntry{p: p, gen: gen}) }

// pushLost makes p due now: a delivery of it was lost (noteLost, from any
// goroutine).
func (l *lot) pushLost(p *park) { l.add(lotEntry{p: p, lost: true}) }

func (l *lot) add(e lotEntry) {
	l.mu.Lock()
	l.due = append(l.due, e)
	l.mu.Unlock()
	select {
	case l.ready <- struct{}{}:
	default:
	}
}

func (l *lot) take() []lotEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.due
	l.due = nil
	return d
}

// lastDelivery reports whether d (or a delivery following it) is on its
// last broker delivery: handing it back would lose it.
func (c *Consumer) lastDelivery(d *delivery) bool {
	if c.maxDeliveries <= 0 {
		return false
	}
	if d.m.Delivery >= c.maxDeliveries {
		return true
	}
	for _, f := range d.followers {
		if f.m.Delivery >= c.maxDeliveries {
			return true
		}
	}
	return false
}

// noteHeld counts deliveries entering the held state and reports the hold.
func (c *Consumer) noteHeld(ctx context.Context, h *hold, wait time.Duration) {
	for _, d := range h.ds {
		for _, x := range d.self() {
			if x.held.CompareAndSwap(false, true) {
				c.stats.holds.Add(1)
				c.stats.heldNow.Add(1)
			}
		}
		if c.cfg.Hooks.OnHold != nil {
			c.cfg.Hooks.OnHold(ctx, HoldEvent{Msg: d.m, Reason: h.reason, Err: h.err, Retry: h.tries, Wait: wait})
		}
	}
	if h.tries == 0 || h.tries&(h.tries-1) == 0 { // log the 1st, 2nd, 4th, 8th... time
		c.log.Warn("consumer: delivery held; will retry in process", "reason", h.reason.String(),
			"messages", len(h.ds), "msg_id", h.ds[0].m.ID, "retry", h.tries, "retry_in", wait, "err", h.err)
	}
}

// nakOrHold naks d with delay, unless d is on its last broker delivery:
// then it is held and restart runs it again after delay.
func (c *Consumer) nakOrHold(ctx context.Context, d *delivery, delay time.Duration, why string) []*hold {
	if d.isLost() {
		return c.letGo(ctx, d)
	}
	if !c.lastDelivery(d) {
		c.nak(ctx, d, delay, why)
		return nil
	}
	return []*hold{{
		ds: []*delivery{d}, reason: HoldDeliveryLimit, err: holdCause(why), wait: delay,
		retry:  func(ctx context.Context) []*hold { return c.restart(ctx, d) },
		giveUp: func(ctx context.Context) { c.handBack(ctx, d, why) },
	}}
}

type holdCause string

func (e holdCause) Error() string { return string(e) }

// handBack returns d to the broker when the consumer lets go of it
// (shutdown): a nak for another consumer, or, when d is on its last
// delivery and a nak would make the broker drop it, a dead letter.
func (c *Consumer) handBack(ctx context.Context, d *delivery, why string) {
	if d.isLost() { // the broker has it already
		for _, h := range c.letGo(ctx, d) {
			h.giveUp(ctx)
		}
		return
	}
	if c.lastDelivery(d) {
		c.deadLetterAtShutdown(ctx, d, "delivery limit at shutdown: "+why)
		return
	}
	c.nak(ctx, d, 0, why)
}

// handBackAll hands back every delivery of ds.
func (c *Consumer) handBackAll(ctx context.Context, ds []*delivery, why string) {
	for _, d := range ds {
		c.handBack(ctx, d, why)
	}
}

// restart runs d again from the claim, in the consumer's mode.
func (c *Consumer) restart(ctx context.Context, d *delivery) []*hold {
	switch {
	case c.cfg.TxHandler != nil || c.cfg.TxBatchHandler != nil:
		return c.processTx(ctx, []*delivery{d})
	case c.cfg.BatchHandler != nil:
		return c.claimAndRun(ctx, []*delivery{d})
	}
	return c.handleOne(ctx, d)
}

// self returns d and its followers.
func (d *delivery) self() []*delivery {
	if len(d.followers) == 0 {
		return []*delivery{d}
	}
	return append([]*delivery{d}, d.followers...)
}
