package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// pending is a batch message whose key this worker now holds.
type pending struct {
	d        *delivery
	held     *idem.Held
	attempts int
}

// processBatch claims the batch's keys in one round trip, settles
// duplicates and keys in progress, and runs the handler on the rest. It
// returns what it holds, and the deliveries it left for later: a second
// message of a key already in the batch with another fingerprint.
func (c *Consumer) processBatch(ctx context.Context, batch []*delivery) (hs []*hold, later []*delivery) {
	batch, hs = c.liveOnly(ctx, batch)
	claims, later, noKey := dedupe(batch, func(k []byte) uint64 { return maphash.Bytes(c.seed, k) })
	for _, d := range noKey {
		hs = append(hs, c.missingKey(broker.ExtractTrace(ctx, d.m), d)...)
	}
	if len(claims) == 0 {
		return hs, later
	}
	if c.cfg.TxBatchHandler != nil {
		return append(hs, c.processTx(ctx, claims)...), later
	}
	return append(hs, c.claimAndRun(ctx, claims)...), later
}

// dedupe splits a batch into the deliveries to claim (one per key), the
// ones to leave for later and the ones without a usable key.
//
// Same key twice in one batch: claimed once; the later copies follow the
// first one's fate (acked if it completes, nak'ed otherwise). A copy with
// another fingerprint is not judged here: which payload is the key's own
// is the store's answer (the key may have been completed with the later
// copy's payload, and the first copy be the reuse). It goes back to the
// worker, to be claimed after this batch, behind the first copy if that
// one is held.
//
// Keys are looked up by hash (no string made per message); a key whose
// hash another key of the batch has goes through a map by key, made then.
func dedupe(batch []*delivery, hash func([]byte) uint64) (claims, later, noKey []*delivery) {
	first := firstPool.Get().(map[uint64]*delivery)
	defer func() {
		clear(first)
		firstPool.Put(first)
	}()
	var byKey map[string]*delivery // keys whose hash another key took
	claims = make([]*delivery, 0, len(batch))
	for _, d := range batch {
		if d.keyErr != nil {
			noKey = append(noKey, d)
			continue
		}
		h := hash(d.key)
		f := first[h]
		if f != nil && !bytes.Equal(f.key, d.key) {
			if f = byKey[string(d.key)]; f == nil {
				if byKey == nil {
					byKey = make(map[string]*delivery)
				}
				byKey[string(d.key)] = d
				claims = append(claims, d)
				continue
			}
		}
		switch {
		case f == nil:
			first[h] = d
			claims = append(claims, d)
		case !bytes.Equal(f.fp, d.fp):
			later = append(later, d)
		default:
			f.followers = append(f.followers, d)
		}
	}
	return claims, later, noKey
}

// Scratch of a batch, reused from batch to batch (a map and a slice of a
// thousand entries each, made and dropped every batch, were 5% of the
// batch path's allocation): dedupe's map, claimAndRun's claim list, which
// Guard.AcquireBatchInto does not keep, and the acquisitions it writes.
var (
	firstPool = sync.Pool{New: func() any { return make(map[uint64]*delivery) }}
	itemsPool = sync.Pool{New: func() any { return new([]idem.BatchItem) }}
	acqsPool  = sync.Pool{New: func() any { return new([]idem.Acquisition) }}
)

// claimAndRun claims claims (deliveries with distinct keys, followers
// attached) and runs the handler on the new ones.
func (c *Consumer) claimAndRun(ctx context.Context, claims []*delivery) []*hold {
	claims, lostHs := c.liveOnly(ctx, claims)
	if len(claims) == 0 {
		return lostHs
	}
	return append(lostHs, c.claimAndRunLive(ctx, claims)...)
}

// claimAndRunLive is claimAndRun once the lost deliveries are let go.
func (c *Consumer) claimAndRunLive(ctx context.Context, claims []*delivery) []*hold {
	ip := itemsPool.Get().(*[]idem.BatchItem)
	items := slices.Grow((*ip)[:0], len(claims))
	for _, d := range claims {
		items = append(items, idem.BatchItem{Key: d.key, Fingerprint: d.fp})
	}
	// The acquisitions are read once, below, and go back to the pool
	// (cleared: it keeps no claim alive) before the handler runs.
	ap := acqsPool.Get().(*[]idem.Acquisition)
	acqs := slices.Grow((*ap)[:0], len(claims))[:len(claims)]
	err := c.cfg.Guard.AcquireBatchInto(ctx, items, acqs)
	clear(items) // the pool keeps no message's key alive
	*ip = items[:0]
	itemsPool.Put(ip)
	if err != nil {
		putAcqs(ap, acqs)
		// Fail closed, and keep the messages: a nak would spend one of
		// the broker's deliveries of each.
		c.storeDown()
		return []*hold{{
			ds: claims, reason: HoldStoreUnavailable, err: err,
			retry: func(ctx context.Context) []*hold { return c.claimAndRun(ctx, claims) },
			giveUp: func(ctx context.Context) {
				c.handBackAll(ctx, claims, "store unavailable at shutdown")
			},
		}}
	}
	c.storeAnswered()
	var hs []*hold
	fresh := make([]pending, 0, len(claims))
	for i, a := range acqs {
		d := claims[i]
		switch {
		case a.Err != nil:
			hs = append(hs, c.claimFailed(ctx, d, a.Err)...)
		case a.Held == nil:
			c.stats.duplicates.Add(int64(1 + len(d.followers)))
			c.ack(ctx, d, true)
		default:
			d.ownClaim = false
			if dead, ok := c.crashLoop(ctx, d, a.Held, a.Result.Attempts); ok {
				hs = append(hs, dead...)
				continue
			}
			fresh = append(fresh, pending{d: d, held: a.Held, attempts: a.Result.Attempts})
		}
	}
	putAcqs(ap, acqs)
	if len(fresh) == 0 {
		return hs
	}
	if c.cfg.Batch.GroupBy == nil {
		return append(hs, c.runGroup(ctx, fresh)...)
	}
	var order []string
	groups := map[string][]pending{}
	for _, p := range fresh {
		g, err := c.groupOf(p.d.m)
		if err != nil {
			// That message fails, as a handler that panicked would.
			hs = append(hs, c.handlerFailed(ctx, p.d, p.held, p.attempts, err)...)
			continue
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], p)
	}
	for _, g := range order {
		hs = append(hs, c.runGroup(ctx, groups[g])...)
	}
	return hs
}

// putAcqs returns claimAndRun's acquisitions to their pool, cleared.
func putAcqs(ap *[]idem.Acquisition, acqs []idem.Acquisition) {
	clear(acqs)
	*ap = acqs[:0]
	acqsPool.Put(ap)
}

// groupOf is Batch.GroupBy(m), with a panic turned into an error.
func (c *Consumer) groupOf(m *broker.Message) (g string, err error) {
	defer func() {
		if r := recover(); r != nil {
			logPanic(c.log, "Batch.GroupBy", r)
			err = fmt.Errorf("consumer: Batch.GroupBy panicked: %v", r)
		}
	}()
	return c.cfg.Batch.GroupBy(m), nil
}

// runGroup runs the batch handler on ps, with in-process retries of a
// whole-batch failure, then settles every message. Messages whose claim
// was lost while the handler ran take the claim-lost path and the handler
// runs again at once on the others (the lost claim cancelled its
// context): no attempt is counted for them.
func (c *Consumer) runGroup(ctx context.Context, ps []pending) []*hold {
	var hs []*hold
	for try := 0; ; {
		if ps, hs = c.livePending(ctx, ps, errLost, hs); len(ps) == 0 {
			return hs // lost while held or between in-process retries
		}
		leaseLost, err := c.runBatchHandler(ctx, ps)
		var pe *PartialError
		if err != nil && !errors.As(err, &pe) {
			err = c.classify(err)
		}
		if err == nil {
			// A claim lost meanwhile shows as a fenced completion.
			return append(hs, c.completeAll(ctx, ps)...)
		}
		live := ps[:0:0]
		gone := make([]bool, len(ps))
		for i, p := range ps {
			if lost(p.held) {
				gone[i] = true
				hs = append(hs, c.claimLost(ctx, p.d, "claim lost while the batch ran")...)
			} else {
				live = append(live, p)
			}
		}
		switch {
		case pe != nil:
			return append(hs, c.settlePartial(ctx, ps, gone, pe)...)
		case len(live) == 0:
			return hs
		case c.transient(err):
			return append(hs, c.holdOrFail(ctx, live, err)...)
		case leaseLost && len(live) < len(ps):
			ps = live // the others were cancelled with the lost ones
			continue
		}
		ps = live
		if !c.retryInProcess(ctx, try, err, nil) {
			c.log.Warn("consumer: batch failed as a whole", "messages", len(ps), "err", err)
			if c.cfg.Batch.OnFailure == BatchDeadLetter {
				err = idem.Permanent(err)
			}
			for _, p := range ps {
				hs = append(hs, c.handlerFailed(ctx, p.d, p.held, p.attempts, err)...)
			}
			return hs
		}
		try++
	}
}

// settlePartial settles a group after a *PartialError: the failed messages
// take the single-message failure path (held, keeping their claims, when
// their error is transient), the others are completed. Messages whose
// claim was lost (gone) were settled already.
func (c *Consumer) settlePartial(ctx context.Context, ps []pending, gone []bool, pe *PartialError) []*hold {
	var hs []*hold
	ok := make([]pending, 0, len(ps))
	var transient []pending
	var terr error
	for i, p := range ps {
		if gone[i] {
			continue
		}
		ferr, failed := pe.Failed[i]
		if !failed {
			ok = append(ok, p)
			continue
		}
		if ferr == nil {
			ferr = errors.New("failed in batch")
		}
		ferr = c.classify(ferr)
		if c.transient(ferr) {
			transient = append(transient, p)
			terr = ferr
			continue
		}
		hs = append(hs, c.handlerFailed(ctx, p.d, p.held, p.attempts, ferr)...)
	}
	hs = append(hs, c.completeAll(ctx, ok)...)
	if len(transient) > 0 {
		hs = append(hs, c.holdOrFail(ctx, transient, terr)...)
	}
	return hs
}

// holdOrFail holds ps after the transient error err (holdGroup), except
// those held for their handler's system past MaxUnavailableHold, which
// fail (an attempt counted).
func (c *Consumer) holdOrFail(ctx context.Context, ps []pending, err error) []*hold {
	var hs []*hold
	keep := ps[:0:0]
	for _, p := range ps {
		if p.d.isLost() { // not held: the broker redelivers it
			hs = append(hs, c.lostClaimed(ctx, p.d, p.held, err)...)
			continue
		}
		if ferr := c.unavailableTooLong(p.d, err); ferr != nil {
			hs = append(hs, c.handlerFailed(ctx, p.d, p.held, p.attempts, ferr)...)
			continue
		}
		keep = append(keep, p)
	}
	if len(keep) > 0 {
		hs = append(hs, c.holdGroup(keep, err))
	}
	return hs
}

// holdGroup keeps ps and their claims after a transient failure; the
// handler runs on them again later.
func (c *Consumer) holdGroup(ps []pending, err error) *hold {
	ds := make([]*delivery, len(ps))
	for i, p := range ps {
		ds[i] = p.d
	}
	return &hold{
		ds: ds, reason: HoldHandlerUnavailable, err: err, wait: transientWait(err),
		retry: func(ctx context.Context) []*hold {
			var hs []*hold
			live, unknown := ps[:0:0], ps[:0:0]
			var uerr error
			for _, p := range ps {
				// Verify each kept claim before the handler runs again
				// under it (see Consumer.renew).
				switch rerr := c.renew(ctx, p.held); {
				case p.d.isLost():
					hs = append(hs, c.lostClaimed(ctx, p.d, p.held, err)...)
				case lost(p.held):
					hs = append(hs, c.claimLost(ctx, p.d, "claim lost while held")...)
				case rerr != nil:
					unknown, uerr = append(unknown, p), rerr
				default:
					live = append(live, p)
				}
			}
			if len(unknown) > 0 {
				h := c.holdGroup(unknown, err)
				h.reason, h.err, h.wait = HoldStoreUnavailable, uerr, 0
				hs = append(hs, h)
			}
			if len(live) == 0 {
				return hs
			}
			return append(hs, c.runGroup(ctx, live)...)
		},
		giveUp: func(ctx context.Context) {
			for _, p := range ps {
				if rerr := p.held.Release(ctx, err); rerr != nil {
					c.log.Warn("consumer: release at shutdown failed; the key is free once its lease lapses", "msg_id", p.d.m.ID, "err", rerr)
				}
				c.handBack(ctx, p.d, "handler unavailable at shutdown")
			}
		},
	}
}

// livePending returns ps without its lost deliveries, whose claims it
// releases with cause (lostClaimed), appending what that leaves held to hs.
func (c *Consumer) livePending(ctx context.Context, ps []pending, cause error, hs []*hold) ([]pending, []*hold) {
	live := ps[:0:0]
	for _, p := range ps {
		if p.d.isLost() {
			hs = append(hs, c.lostClaimed(ctx, p.d, p.held, cause)...)
			continue
		}
		live = append(live, p)
	}
	if len(live) == len(ps) {
		return ps, hs
	}
	return live, hs
}

// completeAll records and acks every message of a successful batch: in one
// round trip when the store is an idem.BatchCompleter; otherwise the guard
// completes keys one by one (a round trip each on a networked store), so
// chunks of the batch complete in parallel. The broker keeps getting
// InProgress for each message until it is acked.
func (c *Consumer) completeAll(ctx context.Context, ps []pending) []*hold {
	if len(ps) == 0 {
		return nil
	}
	ctx, cancel := settlingFor(ctx, len(ps))
	defer cancel()
	if _, ok := c.cfg.Guard.Store().(idem.BatchCompleter); ok {
		hs := make([]*idem.Held, len(ps))
		for i, p := range ps {
			hs[i] = p.held
		}
		var held []*hold
		for i, err := range c.cfg.Guard.CompleteBatch(ctx, hs, nil) {
			held = append(held, c.completed(ctx, ps[i].d, ps[i].held, nil, err)...)
		}
		return held
	}
	par := min(c.cfg.Batch.SettleConcurrency, (len(ps)+63)/64)
	if par <= 1 {
		var held []*hold
		for _, p := range ps {
			held = append(held, c.completed(ctx, p.d, p.held, nil, p.held.Complete(ctx, nil))...)
		}
		return held
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		held []*hold
	)
	chunk := (len(ps) + par - 1) / par
	for start := 0; start < len(ps); start += chunk {
		part := ps[start:min(start+chunk, len(ps))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range part {
				if h := c.completed(ctx, p.d, p.held, nil, p.held.Complete(ctx, nil)); len(h) > 0 {
					mu.Lock()
					held = append(held, h...)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return held
}

// runBatchHandler runs the handler with each message's token in its
// context (MessageToken), the context cancelled with idem.ErrLeaseLost if
// any claim is lost, and a panic turned into an error. leaseLost reports
// that cancellation.
func (c *Consumer) runBatchHandler(ctx context.Context, ps []pending) (leaseLost bool, err error) {
	msgs := make([]*broker.Message, len(ps))
	helds := make([]*idem.Held, len(ps))
	ds := make([]*delivery, len(ps))
	for i, p := range ps {
		msgs[i], helds[i], ds[i] = p.d.m, p.held, p.d
	}
	info := &batchInfo{ds: ds, helds: helds}
	hctx, stop := watchLeases(context.WithValue(ctx, batchKey{}, info), nil, helds, ds)
	defer func() {
		leaseLost = errors.Is(context.Cause(hctx), idem.ErrLeaseLost)
		stop()
	}()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: batch handler panicked", "messages", len(msgs), "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("consumer: batch handler panicked: %v", r)
		}
	}()
	return false, c.cfg.BatchHandler(hctx, msgs)
}
