package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// beater extends the leases of all held claims of a guard from one
// goroutine, so holding a claim costs a list insert instead of a timer. The
// goroutine starts with the first held claim and stops after an idle tick
// or at Guard.Close.
//
// Each claim is extended every Held.interval (a third of its own lease by
// default), counted on the guard's clock from the time the claim or its last
// successful extend was sent: that is when its lease began, so a slow claim
// or extend (a reply that took a while) does not push the next beat later.
// The loop polls at a quarter of the smallest interval held, so a per-call
// lease shorter than the guard's is kept alive too. A claim survives a delay
// (scheduling, a stalled process, a slow store) of up to about 7/12 of its
// lease: its lease must exceed the worst such delay (docs/guard.md).
//
// The claims due in one tick are extended together: in ExtendBatch calls
// of up to beatBatchMax when the store is a BatchExtender (a batch
// consumer holds thousands of keys; one Extend each starved a shared
// connection pool), otherwise one Extend each.
type beater struct {
	g        *Guard
	ext      BatchExtender // the store's, nil when it has none
	interval time.Duration // for the guard's own lease
	smallest atomic.Int64  // smallest interval the loop's tick serves
	kick     chan struct{} // a claim with a smaller interval was added
	rr       atomic.Uint32
	shards   [8]beatShard
	mu       sync.Mutex // guards running and stop
	running  bool
	stop     chan struct{}
	done     chan struct{}
	closed   bool
}

type beatShard struct {
	mu   sync.Mutex
	head *Held
	n    int
	_    [40]byte
}

func newBeater(g *Guard, interval time.Duration) *beater {
	ext, _ := g.store.(BatchExtender)
	return &beater{g: g, ext: ext, interval: interval, kick: make(chan struct{}, 1)}
}

// beatBatchMax is the most claims one ExtendBatch call of the heartbeat
// carries (as bgBatchMax for completions).
const beatBatchMax = 256

// errBatchCall stands for the error of an ExtendBatch call that failed as
// a whole.
var errBatchCall = errors.New("idem: ExtendBatch call failed")

func tickFor(interval time.Duration) time.Duration { return max(interval/4, time.Millisecond) }

// beatInterval is the heartbeat interval of a claim with lease: the guard's
// interval, scaled down in proportion for a lease shorter than the guard's.
func (g *Guard) beatInterval(lease time.Duration) time.Duration {
	hb := g.cfg.heartbeat
	if hb <= 0 || lease >= g.cfg.lease {
		return hb
	}
	return max(time.Duration(float64(hb)*float64(lease)/float64(g.cfg.lease)), time.Microsecond)
}

func (b *beater) add(h *Held) {
	h.lastBeat = h.leaseUntil.Add(-h.lease) // when the claim was sent (not published yet: no lock)
	i := b.rr.Add(1) % uint32(len(b.shards))
	sh := &b.shards[i]
	h.shard = sh // fixed from here on: beat reads it without a lock
	sh.mu.Lock()
	h.linked = true
	h.next = sh.head
	if sh.head != nil {
		sh.head.prev = h
	}
	sh.head = h
	sh.n++
	sh.mu.Unlock()
	b.mu.Lock()
	if !b.running && !b.closed {
		b.running = true
		b.smallest.Store(int64(b.interval))
		b.stop, b.done = make(chan struct{}), make(chan struct{})
		go b.loop(b.stop, b.done)
	}
	b.mu.Unlock()
	if h.interval < time.Duration(b.smallest.Load()) {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

func (b *beater) remove(h *Held) {
	sh := h.shard
	if sh == nil {
		return
	}
	sh.mu.Lock()
	if h.linked {
		if h.prev != nil {
			h.prev.next = h.next
		} else {
			sh.head = h.next
		}
		if h.next != nil {
			h.next.prev = h.prev
		}
		h.prev, h.next, h.linked = nil, nil, false
		sh.n--
	}
	sh.mu.Unlock()
}

func (b *beater) loop(stop, done chan struct{}) {
	defer close(done)
	tick := tickFor(b.interval)
	t := time.NewTicker(tick)
	defer t.Stop()
	var due []*Held
	for {
		select {
		case <-stop:
			return
		case <-b.kick:
		case <-t.C:
		}
		now := b.g.cfg.clock.Now()
		due = due[:0]
		total := 0
		smallest := b.interval
		for i := range b.shards {
			sh := &b.shards[i]
			sh.mu.Lock()
			total += sh.n
			for h := sh.head; h != nil; h = h.next {
				smallest = min(smallest, h.interval)
				if !h.beating && now.Sub(h.lastBeat) >= h.interval {
					h.beating = true
					due = append(due, h)
				}
			}
			sh.mu.Unlock()
		}
		b.smallest.Store(int64(smallest))
		if want := tickFor(smallest); want != tick {
			tick = want
			t.Reset(tick)
		}
		if b.ext != nil {
			for len(due) > 0 {
				n := min(len(due), beatBatchMax)
				go b.beatBatch(slices.Clone(due[:n]))
				due = due[n:]
			}
		} else {
			for _, h := range due {
				go b.beat(h)
			}
		}
		if total == 0 {
			b.mu.Lock()
			if b.idle() {
				b.running = false
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
		}
	}
}

func (b *beater) idle() bool {
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		n := sh.n
		sh.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

func (b *beater) beat(h *Held) {
	// Half a lease: long enough for a slow store, short enough that a
	// failed beat leaves time for the next before the lease runs out.
	ctx, cancel := context.WithTimeout(context.Background(), max(h.lease/2, time.Millisecond))
	sent := b.g.cfg.clock.Now()
	err := b.g.store.Extend(ctx, h.key, h.token, h.lease)
	cancel()
	if b.beaten(h, sent, err) {
		b.g.log.Warn("idem: lease heartbeat failed; retrying", "key", string(truncKey(h.key)), "err", err)
	}
}

// beatBatch extends hs in one ExtendBatch call, with the timeout of its
// shortest lease, and handles each entry's answer as beat handles
// Extend's. A call that failed as a whole (or answered for a different
// number of entries) extended nothing that can be relied on: every claim
// of it stays held and is retried at the next tick, as after a failed
// Extend; it is logged once, not once per claim.
func (b *beater) beatBatch(hs []*Held) {
	es := make([]Extension, len(hs))
	lease := hs[0].lease
	for i, h := range hs {
		es[i] = Extension{Key: h.key, Token: h.token, Lease: h.lease}
		lease = min(lease, h.lease)
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(lease/2, time.Millisecond))
	sent := b.g.cfg.clock.Now()
	errs, err := b.ext.ExtendBatch(ctx, es)
	cancel()
	if err == nil && len(errs) != len(hs) {
		err = fmt.Errorf("%w: ExtendBatch answered %d entries of %d", ErrUnknownOutcome, len(errs), len(hs))
	}
	if err != nil {
		for _, h := range hs {
			b.beaten(h, sent, errBatchCall) // not an entry's answer: never a loss
		}
		b.g.log.Warn("idem: lease heartbeat failed; retrying", "keys", len(hs), "key", string(truncKey(hs[0].key)), "err", err)
		return
	}
	failed, first := 0, -1
	for i, h := range hs {
		// A per-entry ErrFenced or ErrNotFound is that claim's answer
		// alone; an entry's other error (ErrUnavailable from a shard,
		// ErrCorrupt) is retried like a failed Extend.
		if b.beaten(h, sent, errs[i]) {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if failed > 0 {
		b.g.log.Warn("idem: lease heartbeat failed; retrying", "keys", failed, "key", string(truncKey(hs[first].key)), "err", errs[first])
	}
}

// beaten records the answer err to an extend of h sent at sent: the lease
// extended, the claim settled meanwhile, settled by its own effect's
// transaction, or lost (fenced or gone). It reports whether the extend
// failed otherwise: h stays held and is extended again at the next tick.
func (b *beater) beaten(h *Held, sent time.Time, err error) (retry bool) {
	if err == nil {
		h.extended(sent)
	}
	h.mu.Lock()
	settled, settling := h.settled, h.settling
	h.mu.Unlock()
	if sh := h.shard; sh != nil {
		sh.mu.Lock()
		h.beating = false
		if err == nil {
			h.lastBeat = sent
		}
		sh.mu.Unlock()
	}
	if settled || err == nil {
		return false
	}
	if settling {
		// The settle may just have been recorded (an extend then gets
		// ErrFenced); its own answer says whether the claim was lost.
		return false
	}
	if errors.Is(err, ErrFenced) && b.settledElsewhere(h) {
		// Completed with our token by the effect's own transaction
		// (pgstore's or mysqlstore's DoTx under the consumer runtime's
		// claim): done, not lost. Nothing left to extend.
		b.remove(h)
		return false
	}
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrNotFound) {
		b.remove(h)
		h.markLost(context.Background(), err)
		return false
	}
	return true
}

// settledElsewhere reports that h's record is Completed with h's token:
// the holder's effect completed the claim itself, in its own transaction.
func (b *beater) settledElsewhere(h *Held) bool {
	ctx, cancel := context.WithTimeout(context.Background(), max(h.lease/2, time.Millisecond))
	defer cancel()
	rec, err := b.g.store.Get(ctx, h.key)
	return err == nil && rec.Token == h.token && rec.State == StateCompleted
}

func (b *beater) close() {
	b.mu.Lock()
	b.closed = true
	running, stop, done := b.running, b.stop, b.done
	b.running = false
	b.mu.Unlock()
	if running {
		close(stop)
		<-done
	}
}

// Renew extends the claim's lease now, with its fencing token, and reports
// whether the claim is still held. Call it before running an effect again
// under a claim kept across a wait (the consumer runtime does, for a
// message it held while its handler's system or the store was
// unavailable): the heartbeat extends the claim meanwhile, but if its
// extends failed for longer than the lease another process may have taken
// the key over and run the effect, and the heartbeat may not have noticed
// yet.
//
//   - nil: still held, the lease runs one lease from now;
//   - an error matching ErrLeaseLost (and ErrFenced or ErrNotFound): the
//     claim was taken over or removed. As when the heartbeat finds it:
//     Done is closed, the handler's context cancelled, OnLeaseLost called,
//     the heartbeat stopped. Do not run the effect; settling the claim
//     gets ErrFenced;
//   - any other error (the store's, e.g. ErrUnavailable): not known; the
//     claim stays held and its heartbeat goes on. Do not run the effect
//     yet; renew again later.
//
// A fail-open pass holds no claim: nil. A settled claim: ErrInvalidArgument.
func (h *Held) Renew(ctx context.Context) error {
	if h.open {
		return nil
	}
	h.mu.Lock()
	lost, lostErr, settled := h.lost, h.lostErr, h.settled || h.settling
	h.mu.Unlock()
	switch {
	case lost:
		return lostErr
	case settled:
		return fmt.Errorf("%w: renew %q: the claim is settled", ErrInvalidArgument, truncKey(h.key))
	}
	ctx, cancel := context.WithTimeout(ctx, max(h.lease/2, time.Millisecond))
	sent := h.g.cfg.clock.Now()
	err := h.g.store.Extend(ctx, h.key, h.token, h.lease)
	cancel()
	if err == nil {
		h.extended(sent)
		if sh := h.shard; sh != nil {
			sh.mu.Lock()
			if sent.After(h.lastBeat) {
				h.lastBeat = sent
			}
			sh.mu.Unlock()
		}
		return nil
	}
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrNotFound) {
		if h.g.beats != nil {
			h.g.beats.remove(h)
		}
		h.markLost(context.WithoutCancel(ctx), err)
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.lostErr
	}
	return fmt.Errorf("idem: renew %q: %w", truncKey(h.key), err)
}
