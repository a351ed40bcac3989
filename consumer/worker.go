package consumer

import (
	"context"
	"time"
)

// worker handles the deliveries routed to it (one order key always goes to
// the same worker), one at a time or in batches, and parks the ones that
// are held: a parked delivery blocks its order key (later deliveries of
// that key wait behind it, in order) while the worker goes on with other
// keys, and is retried when its timer fires or the store answers again.
type worker struct {
	c        *Consumer
	in       <-chan *delivery
	batch    bool
	backlog  []*delivery // released from parks, handled before new input
	keys     map[string]*keyWait
	parks    map[*park]struct{}
	lot      *lot
	timer    *time.Timer // batch fill
	draining bool
}

func (c *Consumer) newWorker(in <-chan *delivery) *worker {
	w := &worker{
		c: c, in: in, keys: map[string]*keyWait{}, parks: map[*park]struct{}{}, lot: newLot(),
		batch: c.cfg.BatchHandler != nil || c.cfg.TxBatchHandler != nil,
	}
	if w.batch {
		w.timer = time.NewTimer(time.Hour)
		w.timer.Stop()
	}
	return w
}

// run works until its input is closed and every delivery is settled: at
// that point parked deliveries are handed back (see drain).
func (w *worker) run(ctx context.Context) {
	for {
		if len(w.backlog) == 0 {
			if w.in == nil && len(w.parks) == 0 {
				return
			}
			w.wait(ctx)
			continue
		}
		if w.batch {
			w.nextBatch(ctx)
			continue
		}
		d := w.backlog[0]
		w.backlog[0] = nil
		w.backlog = w.backlog[1:]
		if !w.blocked(d) {
			w.dispatch(ctx, d, nil)
		}
	}
}

// wait blocks for the next event: a delivery (queued in the backlog), a
// park whose retry is due, or the store answering again.
func (w *worker) wait(ctx context.Context) {
	select {
	case d, ok := <-w.in:
		if !ok {
			w.drain(ctx)
			return
		}
		if w.batch {
			w.backlog = append(w.backlog, d)
		} else if !w.blocked(d) {
			w.dispatch(ctx, d, nil)
		}
	case <-w.lot.ready:
		w.retryDue(ctx)
	case <-w.c.store.upCh():
		w.wake()
	}
}

// nextBatch takes up to Batch.Size deliveries from the backlog, then from
// the input until Batch.Wait has passed since the first, and handles them.
func (w *worker) nextBatch(ctx context.Context) {
	size := w.c.cfg.Batch.Size
	batch := make([]*delivery, 0, min(size, len(w.backlog)+16))
	for len(w.backlog) > 0 && len(batch) < size {
		d := w.backlog[0]
		w.backlog[0] = nil
		w.backlog = w.backlog[1:]
		if !w.blocked(d) {
			batch = append(batch, d)
		}
	}
	closed := false
	if len(batch) > 0 && len(batch) < size && w.in != nil {
		w.timer.Reset(w.c.cfg.Batch.Wait)
	fill:
		for len(batch) < size {
			select {
			case d, ok := <-w.in:
				if !ok {
					closed = true
					break fill
				}
				if !w.blocked(d) {
					batch = append(batch, d)
				}
			case <-w.timer.C:
				break fill
			}
		}
		if !w.timer.Stop() {
			select {
			case <-w.timer.C:
			default:
			}
		}
	}
	if len(batch) > 0 {
		w.dispatch(ctx, nil, batch)
	}
	if closed {
		w.drain(ctx)
	}
}

// blocked queues d behind the parked delivery of its order key, if any.
func (w *worker) blocked(d *delivery) bool {
	if len(d.okey) == 0 {
		return false
	}
	kw := w.keys[string(d.okey)]
	if kw == nil {
		return false
	}
	kw.waiting = append(kw.waiting, d)
	return true
}

// dispatch handles a new delivery d (single mode) or batch, and parks
// what they leave held.
func (w *worker) dispatch(ctx context.Context, d *delivery, batch []*delivery) {
	if ctx.Err() != nil {
		// Past ShutdownTimeout: hand back what was never started.
		if d != nil {
			batch = append(batch, d)
		}
		sctx, cancel := settlingFor(ctx, len(batch))
		defer cancel()
		w.c.handBackAll(sctx, batch, "shutdown timeout")
		return
	}
	var hs []*hold
	var later []*delivery
	if d != nil {
		hs = w.c.handleOne(ctx, d)
	} else {
		hs, later = w.c.processBatch(ctx, batch)
	}
	if len(hs) > 0 {
		w.park(ctx, hs) // first, so that later copies of a held key wait behind it
	}
	if len(later) > 0 {
		w.backlog = append(later, w.backlog...)
	}
}

// park parks holds; while draining they are given up at once.
func (w *worker) park(ctx context.Context, hs []*hold) {
	for _, h := range hs {
		if w.draining || ctx.Err() != nil {
			w.giveUp(ctx, h)
			continue
		}
		p := &park{h: h, lot: w.lot}
		for _, d := range h.ds {
			d.parked.Store(p)
			for _, x := range d.self() {
				if len(x.okey) == 0 || containsKey(p.keys, x.okey) {
					continue
				}
				k := string(x.okey)
				kw := w.keys[k]
				if kw == nil {
					kw = &keyWait{}
					w.keys[k] = kw
				}
				kw.parks++
				p.keys = append(p.keys, k)
			}
		}
		w.parks[p] = struct{}{}
		wait := h.wait
		if wait <= 0 {
			wait = w.c.holdDelay(h.tries)
		}
		w.c.noteHeld(ctx, h, wait)
		if h.lostIn() { // lost before it was parked: noteLost found no park
			wait = 0
		}
		w.schedule(p, wait)
	}
}

func containsKey(keys []string, k []byte) bool {
	for _, x := range keys {
		if x == string(k) {
			return true
		}
	}
	return false
}

func (w *worker) schedule(p *park, d time.Duration) {
	p.gen++
	if p.timer != nil {
		p.timer.Stop()
	}
	gen := p.gen
	p.timer = time.AfterFunc(d, func() { w.lot.push(p, gen) })
}

func (w *worker) retryDue(ctx context.Context) {
	for _, e := range w.lot.take() {
		if e.p.gone || (e.gen != e.p.gen && !e.lost) {
			continue
		}
		w.retry(ctx, e.p)
	}
}

// retry resumes a parked hold, parks what it leaves held, and releases
// the deliveries waiting behind keys that are no longer held.
func (w *worker) retry(ctx context.Context, p *park) {
	if p.h.reason == HoldStoreUnavailable && !p.h.lostIn() {
		if ok, wait := w.c.probe(); !ok { // another held delivery probes the store first
			w.schedule(p, wait+time.Duration(len(w.parks))*time.Microsecond)
			return
		}
	}
	p.lastTry = time.Now()
	hs := p.h.retry(ctx)
	for _, h := range hs {
		if h.reason == p.h.reason && h.tries == 0 {
			h.tries = p.h.tries + 1
		}
	}
	w.park(ctx, hs) // first, so keys still held stay blocked
	w.unpark(p)
}

func (w *worker) unpark(p *park) {
	p.gone = true
	if p.timer != nil {
		p.timer.Stop()
	}
	for _, d := range p.h.ds {
		d.parked.CompareAndSwap(p, nil)
	}
	delete(w.parks, p)
	for _, k := range p.keys {
		kw := w.keys[k]
		kw.parks--
		if kw.parks == 0 {
			w.backlog = append(w.backlog, kw.waiting...)
			delete(w.keys, k)
		}
	}
}

// wake retries at once the holds waiting for the store (or for a system
// that may be the store) after it answered again, no sooner than
// Backoff.Initial after their last try, so a store that flaps does not
// make them spin.
func (w *worker) wake() {
	now := time.Now()
	for p := range w.parks {
		if p.h.reason != HoldStoreUnavailable && p.h.reason != HoldHandlerUnavailable {
			continue
		}
		p.h.tries = 0
		w.schedule(p, max(0, p.lastTry.Add(w.c.cfg.Backoff.Initial).Sub(now)))
	}
}

// drain runs when the input is closed (shutdown): parked deliveries and
// the ones waiting behind them are handed back (nak, or dead-letter on a
// last delivery); from now on a new hold is handed back at once.
func (w *worker) drain(ctx context.Context) {
	w.in = nil
	w.draining = true
	for p := range w.parks {
		p.gone = true
		if p.timer != nil {
			p.timer.Stop()
		}
		w.giveUp(ctx, p.h)
	}
	clear(w.parks)
	if len(w.keys) > 0 {
		sctx, cancel := settling(ctx)
		for _, kw := range w.keys {
			w.c.handBackAll(sctx, kw.waiting, "shutdown: waiting behind a held delivery of its order key")
		}
		cancel()
		clear(w.keys)
	}
}

func (w *worker) giveUp(ctx context.Context, h *hold) {
	sctx, cancel := settlingFor(ctx, len(h.ds))
	defer cancel()
	w.c.log.Info("consumer: handing back a held delivery at shutdown", "reason", h.reason.String(), "messages", len(h.ds), "msg_id", h.ds[0].m.ID)
	h.giveUp(sctx)
}
