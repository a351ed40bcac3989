package redisstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/idem-dev/idem"
)

// maxCoalesce bounds the claims one coalesced script carries.
const maxCoalesce = 256

// coalescer merges concurrent Claim calls into batch scripts, like a group
// commit: while max batches are in flight, new claims queue; when one
// returns, everything queued goes in the next one. A caller that finds a
// free slot sends at once (with whatever queued before it), so a lone
// caller never waits for anyone and latency at low concurrency is
// unchanged; under load each claim costs Redis (and the client) a share of
// one script call and one round trip instead of a whole one. More than one
// batch in flight keeps the server busy while the next batch forms.
type coalescer struct {
	s        *Store
	max      int // batches in flight at most
	mu       sync.Mutex
	queue    []*waiter
	inflight int
}

type waiter struct {
	req  idem.ClaimRequest
	ctx  context.Context
	sent bool // guarded by coalescer.mu
	done chan struct{}
	res  idem.BatchResult
	err  error
}

// claim queues req and waits for its result. A caller whose context ends
// while its claim is queued gets the context's error (nothing was sent);
// once sent, it gets ErrUnknownOutcome (the claim may have been applied).
func (co *coalescer) claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	w := &waiter{req: req, ctx: ctx, done: make(chan struct{})}
	co.mu.Lock()
	co.queue = append(co.queue, w)
	if co.inflight < co.max {
		// A slot is free: this caller sends what is queued (usually just
		// its own claim) without a hand-off, then passes its slot, and
		// anything that queued meanwhile, to a worker goroutine.
		co.inflight++
		batch := co.take()
		co.mu.Unlock()
		co.send(batch)
		co.mu.Lock()
		if len(co.queue) > 0 {
			go co.loop()
		} else {
			co.inflight--
		}
	}
	co.mu.Unlock()
	select {
	case <-w.done:
		return w.result()
	case <-ctx.Done():
		select {
		case <-w.done: // the answer arrived too: prefer it
			return w.result()
		default:
		}
		co.mu.Lock()
		sent := w.sent
		if !sent {
			w.req.Key = nil // take skips it
		}
		co.mu.Unlock()
		if !sent {
			return idem.Claim{}, ctx.Err()
		}
		return idem.Claim{}, fmt.Errorf("%w: redisstore: claim: %w", idem.ErrUnknownOutcome, ctx.Err())
	}
}

func (w *waiter) result() (idem.Claim, error) {
	if w.err != nil {
		return idem.Claim{}, w.err
	}
	return w.res.Claim, w.res.Err
}

// take removes up to maxCoalesce live claims from the queue and marks them
// sent. Called with mu held.
func (co *coalescer) take() []*waiter {
	var batch []*waiter
	n := 0
	for n < len(co.queue) && len(batch) < maxCoalesce {
		w := co.queue[n]
		n++
		if w.req.Key == nil { // its caller gave up before it was sent
			continue
		}
		w.sent = true
		batch = append(batch, w)
	}
	co.queue = co.queue[n:]
	if len(co.queue) == 0 {
		co.queue = nil
	}
	return batch
}

// loop holds one in-flight slot and sends batches until the queue is
// empty, then gives the slot back and exits (no goroutine lingers on an
// idle store).
func (co *coalescer) loop() {
	for {
		co.mu.Lock()
		batch := co.take()
		if len(batch) == 0 && len(co.queue) == 0 {
			co.inflight--
			co.mu.Unlock()
			return
		}
		co.mu.Unlock()
		if len(batch) > 0 {
			co.send(batch)
		}
	}
}

func (co *coalescer) send(batch []*waiter) {
	reqs := make([]idem.ClaimRequest, len(batch))
	for i, w := range batch {
		reqs[i] = w.req
	}
	// A batch of several outlives any one caller's context: each caller
	// stops waiting on its own (see claim); the client's timeouts bound it.
	ctx := batch[0].ctx
	if len(batch) > 1 {
		ctx = context.WithoutCancel(ctx)
	}
	res, err := co.s.claimBatch(ctx, reqs)
	for i, w := range batch {
		if err != nil {
			w.err = err
		} else {
			w.res = res[i]
		}
		close(w.done)
	}
}
