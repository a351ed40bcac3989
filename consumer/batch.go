package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// pending is a batch message whose key this worker now holds.
type pending struct {
	d        *delivery
	held     *idem.Held
	attempts int
}

// batchWorker fills a batch from its queue (up to Batch.Size messages or
// Batch.Wait after the first) and processes it.
func (c *Consumer) batchWorker(ctx context.Context, q <-chan *delivery) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		d, ok := <-q
		if !ok {
			return
		}
		batch := []*delivery{d}
		timer.Reset(c.cfg.Batch.Wait)
	fill:
		for len(batch) < c.cfg.Batch.Size {
			select {
			case d, ok := <-q:
				if !ok {
					break fill
				}
				batch = append(batch, d)
			case <-timer.C:
				break fill
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if ctx.Err() != nil {
			for _, d := range batch {
				c.nak(ctx, d, 0, "shutdown timeout")
			}
		} else {
			c.processBatch(ctx, batch)
		}
		c.win.release(len(batch))
	}
}

// processBatch claims the batch's keys in one round trip, settles
// duplicates and keys in progress, and runs the handler on the rest.
func (c *Consumer) processBatch(ctx context.Context, batch []*delivery) {
	// Same key twice in one batch: claim it once; the later copies follow
	// the first one's fate (acked if it completes, nak'ed otherwise).
	first := make(map[string]*delivery, len(batch))
	claims := make([]*delivery, 0, len(batch))
	for _, d := range batch {
		if d.keyErr != nil {
			c.missingKey(broker.ExtractTrace(ctx, d.m), d)
			continue
		}
		if f := first[string(d.key)]; f != nil {
			if !bytes.Equal(f.fp, d.fp) {
				c.deadLetter(ctx, d, "fingerprint mismatch: key reused with another payload in the same batch")
				continue
			}
			f.followers = append(f.followers, d)
			continue
		}
		first[string(d.key)] = d
		claims = append(claims, d)
	}
	if len(claims) == 0 {
		return
	}
	if c.cfg.TxBatchHandler != nil {
		c.processTxBatch(ctx, claims)
		return
	}
	items := make([]idem.BatchItem, len(claims))
	for i, d := range claims {
		items[i] = idem.BatchItem{Key: d.key, Fingerprint: d.fp}
	}
	acqs, err := c.cfg.Guard.AcquireBatch(ctx, items)
	if err != nil {
		c.storeDown()
		c.log.Warn("consumer: batch claim failed; failing closed", "messages", len(batch), "err", err, "retry_in", c.cfg.StoreDownDelay)
		for _, d := range claims {
			c.nak(ctx, d, c.cfg.StoreDownDelay, "store unavailable")
		}
		return
	}
	fresh := make([]pending, 0, len(claims))
	for i, a := range acqs {
		d := claims[i]
		switch {
		case a.Err != nil:
			c.claimFailed(ctx, d, a.Err)
		case a.Held == nil:
			c.stats.duplicates.Add(int64(1 + len(d.followers)))
			c.ack(ctx, d)
		default:
			fresh = append(fresh, pending{d: d, held: a.Held, attempts: a.Result.Attempts})
		}
	}
	if len(fresh) == 0 {
		return
	}
	if c.cfg.Batch.GroupBy == nil {
		c.runGroup(ctx, fresh)
		return
	}
	var order []string
	groups := map[string][]pending{}
	for _, p := range fresh {
		g := c.cfg.Batch.GroupBy(p.d.m)
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], p)
	}
	for _, g := range order {
		c.runGroup(ctx, groups[g])
	}
}

// runGroup runs the batch handler on ps, with in-process retries of a
// whole-batch failure, then settles every message.
func (c *Consumer) runGroup(ctx context.Context, ps []pending) {
	msgs := make([]*broker.Message, len(ps))
	ds := make([]*delivery, len(ps))
	for i, p := range ps {
		msgs[i], ds[i] = p.m(), p.d
	}
	var err error
	for try := 0; ; try++ {
		err = c.runBatchHandler(ctx, msgs, ds)
		var pe *PartialError
		if err == nil || errors.As(err, &pe) || !c.retryInProcess(ctx, try, err, nil) {
			break
		}
	}
	var pe *PartialError
	switch {
	case err == nil:
		c.completeAll(ctx, ps)
	case errors.As(err, &pe):
		ok := make([]pending, 0, len(ps))
		for i, p := range ps {
			if ferr, failed := pe.Failed[i]; failed {
				if ferr == nil {
					ferr = errors.New("failed in batch")
				}
				c.handlerFailed(ctx, p.d, p.held, p.attempts, ferr)
			} else {
				ok = append(ok, p)
			}
		}
		c.completeAll(ctx, ok)
	default:
		c.log.Warn("consumer: batch failed as a whole", "messages", len(ps), "err", err)
		if c.cfg.Batch.OnFailure == BatchDeadLetter {
			err = idem.Permanent(err)
		}
		for _, p := range ps {
			c.handlerFailed(ctx, p.d, p.held, p.attempts, err)
		}
	}
}

func (p pending) m() *broker.Message { return p.d.m }

// completeAll records and acks every message of a successful batch: in one
// round trip when the store is an idem.BatchCompleter; otherwise the guard
// completes keys one by one (a round trip each on a networked store), so
// chunks of the batch complete in parallel.
func (c *Consumer) completeAll(ctx context.Context, ps []pending) {
	ctx, cancel := settlingFor(ctx, len(ps))
	defer cancel()
	if _, ok := c.cfg.Guard.Store().(idem.BatchCompleter); ok {
		hs := make([]*idem.Held, len(ps))
		for i, p := range ps {
			hs[i] = p.held
		}
		for i, err := range c.cfg.Guard.CompleteBatch(ctx, hs, nil) {
			c.completed(ctx, ps[i].d, err)
		}
		return
	}
	par := min(c.cfg.Batch.SettleConcurrency, (len(ps)+63)/64)
	if par <= 1 {
		for _, p := range ps {
			c.completed(ctx, p.d, p.held.Complete(ctx, nil))
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (len(ps) + par - 1) / par
	for start := 0; start < len(ps); start += chunk {
		part := ps[start:min(start+chunk, len(ps))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range part {
				c.completed(ctx, p.d, p.held.Complete(ctx, nil))
			}
		}()
	}
	wg.Wait()
}

// runBatchHandler runs the handler with InProgress heartbeats for every
// message of the batch and turns a panic into an error.
func (c *Consumer) runBatchHandler(ctx context.Context, msgs []*broker.Message, ds []*delivery) (err error) {
	hctx, cancel := context.WithCancelCause(ctx)
	stop := c.keepAlive(hctx, cancel, nil, ds...)
	defer stop()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: batch handler panicked", "messages", len(msgs), "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("consumer: batch handler panicked: %v", r)
		}
	}()
	return c.cfg.BatchHandler(hctx, msgs)
}
