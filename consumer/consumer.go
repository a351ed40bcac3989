package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// Stats counts what a Consumer did with its deliveries.
type Stats struct {
	Handled      int64 // handler ran and its completion was recorded; acked
	Duplicates   int64 // key already completed (or message already dead-lettered); acked or terminated without running
	Naked        int64 // sent back to the broker with a delay
	DeadLettered int64 // published to the dead-letter topic (or rejected) and terminated
	StoreErrors  int64 // claims or settles that failed on the store (fail closed)
	Unrecorded   int64 // effect done, completion not recorded; acked and logged
	SettleErrors int64 // ack/nak/term calls the broker refused
	// Holds counts deliveries the consumer kept instead of handing them
	// back (store or handler's system unavailable, last broker delivery,
	// failing dead-letter publish); HeldNow is how many are held now.
	Holds   int64
	HeldNow int64
	// InFlight is how many fetched deliveries are not settled yet (being
	// handled, waiting for a worker, or held): a gauge, at most
	// MaxInFlight unless an adapter returned more than asked.
	InFlight int64
	// DeadLetterErrors counts dead-letter publishes that failed (each
	// retry counts).
	DeadLetterErrors int64
	// Lost counts deliveries the broker reported lost
	// (broker.ErrDeliveryLost: their connection or channel closed, their
	// partition was revoked...) before the consumer settled them; the
	// broker delivers each again. The consumer stopped working for them
	// (see Consumer). Not counted in SettleErrors.
	Lost int64
}

type counters struct {
	handled, duplicates, naked, deadLettered, storeErrors, unrecorded, settleErrors atomic.Int64
	holds, heldNow, deadLetterErrors, inFlight, lost                                atomic.Int64
}

// Consumer runs a handler over a subscriber's deliveries through the
// guard. Create it with New and start it with Run.
type Consumer struct {
	cfg           Config
	log           *slog.Logger
	seed          maphash.Seed
	win           *window
	stats         counters
	ran           atomic.Bool
	maxDeliveries int        // the subscriber's delivery limit; 0: none
	inflight      *inflight  // nil when InProgressInterval < 0
	store         storeState // whether the guard's store is known down
	classifier    func(error) error
	// pausedUntil (unix nanos): the store failed; fetching waits until
	// then (or until the store answers) instead of fetching messages that
	// would only be held.
	pausedUntil atomic.Int64
}

// storeDown records a store failure: fetching pauses for StoreDownDelay
// and held deliveries waiting for the store retry one at a time.
func (c *Consumer) storeDown() {
	c.pauseFetching()
	c.store.markDown()
	c.stats.storeErrors.Add(1)
}

// pauseFetching stops fetching for StoreDownDelay or until the store
// answers.
func (c *Consumer) pauseFetching() {
	c.pausedUntil.Store(time.Now().Add(c.cfg.StoreDownDelay).UnixNano())
}

// storeAnswered records that a store call succeeded: if the store was
// down, fetching resumes and held deliveries retry now.
func (c *Consumer) storeAnswered() {
	if c.store.markUp() {
		c.pausedUntil.Store(0)
		c.log.Info("consumer: store answers again; resuming held deliveries")
	}
}

// delivery is one fetched message on its way through a worker.
type delivery struct {
	c         *Consumer
	m         *broker.Message
	key       []byte
	keyErr    error
	fp        []byte
	okey      []byte      // order key; empty for none
	worker    int         // index of the worker it is routed to
	followers []*delivery // same key later in the same batch: settled like this one
	settled   atomic.Bool
	held      atomic.Bool
	steps     *stepState // step claims kept while the delivery is held (Steps)
	txFails   int        // in-process retries after failures, tx modes (attempts = Delivery + txFails)
	ownClaim  bool       // our claim of the key may still be live (its release failed)
	// lost: the broker reported the delivery lost (broker.ErrDeliveryLost);
	// it will deliver it again. parked is the park holding d, if any, so
	// that the loss retries it at once (see noteLost).
	lost   atomic.Bool
	parked atomic.Pointer[park]
	// unavailSince: when its handler's system was first found unavailable
	// (MaxUnavailableHold counts from it).
	unavailSince time.Time

	// inflight list links, guarded by shard.mu
	prev, next *delivery
	shard      *inflightShard
	lastSignal time.Time
	lostCh     <-chan struct{} // its Acker's broker.LostNotifier channel, if any
}

// New checks cfg and returns a Consumer. It warns (through the guard's
// logger) when the guard's record TTL is shorter than the subscriber's
// redelivery window plus MaxAttempts naks of Backoff.Max (invariant 6).
func New(cfg Config) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cfg = cfg.recovering()
	if w := cfg.Subscriber.RedeliveryWindow(); w > 0 {
		// Our own nak delays stretch the broker's window.
		naks := time.Duration(cfg.MaxAttempts) * cfg.Backoff.Max
		if w <= math.MaxInt64-naks {
			w += naks
		}
		_ = cfg.Guard.CheckRedeliveryWindow(w)
	}
	c := &Consumer{
		cfg:  cfg,
		log:  cfg.Logger,
		seed: maphash.MakeSeed(),
		win:  newWindow(cfg.MaxInFlight),
	}
	if dl, ok := cfg.Subscriber.(broker.DeliveryLimiter); ok {
		c.maxDeliveries = dl.MaxDeliveries()
	}
	if cfg.InProgressInterval > 0 {
		c.inflight = newInflight(c, cfg.InProgressInterval)
	}
	c.classifier = classifierFor(cfg)
	return c, nil
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Handled: s.handled.Load(), Duplicates: s.duplicates.Load(), Naked: s.naked.Load(),
		DeadLettered: s.deadLettered.Load(), StoreErrors: s.storeErrors.Load(),
		Unrecorded: s.unrecorded.Load(), SettleErrors: s.settleErrors.Load(),
		Holds: s.holds.Load(), HeldNow: s.heldNow.Load(), DeadLetterErrors: s.deadLetterErrors.Load(),
		InFlight: s.inFlight.Load(), Lost: s.lost.Load(),
	}
}

// Run fetches and handles messages until ctx ends or the subscriber is
// closed, then drains: messages already fetched are handled and settled
// within ShutdownTimeout (handlers keep a live context until then), held
// ones are handed back at once (nak, or dead-letter on a last delivery),
// what is left after the timeout is handed back too. It returns nil after
// a shutdown through ctx, broker.ErrClosed if the subscriber was closed
// under it. Run may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	if c.inflight != nil {
		c.inflight.start()
		defer c.inflight.close()
	}
	queues := make([]chan *delivery, c.cfg.Workers)
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan *delivery, c.cfg.MaxInFlight)
		w := c.newWorker(queues[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(workCtx)
		}()
	}
	runErr := c.fetchLoop(ctx, queues)
	for _, q := range queues {
		close(q)
	}
	// Drain; past the deadline workers hand back what is left (workCtx done).
	t := time.AfterFunc(c.cfg.ShutdownTimeout, stopWork)
	wg.Wait()
	t.Stop()
	return runErr
}

func (c *Consumer) fetchLoop(ctx context.Context, queues []chan *delivery) error {
	errDelay := 100 * time.Millisecond
	for {
		// Backpressure: one slot per message fetched, and wait for a
		// quarter of the window (or a full fetch) to be free.
		low := min(c.cfg.FetchBatch, max(1, c.cfg.MaxInFlight/4))
		n, err := c.win.acquire(ctx, low, c.cfg.FetchBatch)
		if err != nil {
			return nil
		}
		if !c.waitPause(ctx) {
			c.win.release(n)
			return nil
		}
		msgs, err := c.cfg.Subscriber.Fetch(ctx, n)
		if len(msgs) > n {
			c.win.take(len(msgs) - n) // an adapter that overshot max
		} else {
			c.win.release(n - len(msgs))
		}
		c.stats.inFlight.Add(int64(len(msgs)))
		now := time.Now()
		for _, m := range msgs {
			d := c.prepare(m)
			if c.inflight != nil {
				c.inflight.add(d, now)
			}
			queues[d.worker] <- d
		}
		if err == nil {
			errDelay = 100 * time.Millisecond
			continue
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, broker.ErrClosed):
			return err
		}
		c.log.Warn("consumer: fetch failed; retrying", "err", err, "retry_in", errDelay)
		if !sleep(ctx, errDelay) {
			return nil
		}
		errDelay = min(2*errDelay, 5*time.Second)
	}
}

// waitPause waits while fetching is paused for a store failure, until the
// pause ends or the store answers; false when ctx ended.
func (c *Consumer) waitPause(ctx context.Context) bool {
	for {
		d := time.Until(time.Unix(0, c.pausedUntil.Load()))
		if d <= 0 {
			return true
		}
		c.log.Debug("consumer: store down; fetching paused", "for", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.store.upCh():
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

func (c *Consumer) prepare(m *broker.Message) (d *delivery) {
	d = &delivery{c: c, m: m}
	defer func() {
		// User key, fingerprint and order functions run on the fetch
		// loop: a panic there must not take the consumer down.
		if r := recover(); r != nil {
			c.log.Error("consumer: key or fingerprint function panicked", "msg_id", m.ID, "panic", r, "stack", string(debug.Stack()))
			d.key, d.fp = nil, nil
			d.keyErr = fmt.Errorf("%w: key function panicked: %v", ErrNoKey, r)
		}
		d.worker, d.okey = c.route(m, d)
	}()
	d.key, d.keyErr = c.cfg.Key(m)
	if d.keyErr == nil {
		if err := idem.ValidateKey(d.key); err != nil {
			d.keyErr = fmt.Errorf("%w: %w", ErrNoKey, err)
		}
	}
	if d.keyErr == nil {
		d.fp = c.cfg.Fingerprint(m)
	}
	return d
}

// route picks d's worker and order key: equal order keys go to the same
// worker. A message without an order key is not ordered with any other.
func (c *Consumer) route(m *broker.Message, d *delivery) (w int, okey []byte) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: order key function panicked", "msg_id", m.ID, "panic", r, "stack", string(debug.Stack()))
			w, okey = 0, nil
		}
	}()
	k := c.cfg.OrderKey(m, d.key)
	if len(k) == 0 {
		return 0, nil
	}
	return int(maphash.Bytes(c.seed, k) % uint64(c.cfg.Workers)), k
}

// handleOne runs one delivery through the guard and settles it, or returns
// it held.
func (c *Consumer) handleOne(ctx context.Context, d *delivery) []*hold {
	ctx = broker.ExtractTrace(ctx, d.m)
	if d.isLost() {
		return c.letGo(ctx, d)
	}
	if d.keyErr != nil {
		return c.missingKey(ctx, d)
	}
	if c.cfg.TxHandler != nil {
		return c.processTx(ctx, []*delivery{d})
	}
	held, res, err := c.cfg.Guard.Acquire(ctx, d.key, idem.WithFingerprint(d.fp))
	if err != nil {
		return c.claimFailed(ctx, d, err)
	}
	c.storeAnswered()
	d.ownClaim = false
	if held == nil {
		c.stats.duplicates.Add(1)
		c.ack(ctx, d, true)
		return nil
	}
	if hs, ok := c.crashLoop(ctx, d, held, res.Attempts); ok {
		return hs
	}
	return c.runClaimed(ctx, d, held, res.Attempts)
}

// crashLoop dead-letters d without running its handler when MaxAttempts
// earlier claims of its key ended without being settled: each holder died
// running it (a crash loop on a poison message: an OOM kill, a fatal
// signal) or let go of it at shutdown. A handler that kills its process
// never returns an error, so handlerFailed never counts it; without this
// the loop goes on until the broker's delivery limit silently drops the
// message (JetStream's MaxDeliver), or forever where there is none.
func (c *Consumer) crashLoop(ctx context.Context, d *delivery, held *idem.Held, attempts int) ([]*hold, bool) {
	if attempts <= c.cfg.MaxAttempts {
		return nil, false
	}
	err := idem.Permanent(fmt.Errorf("consumer: attempts exhausted: %d earlier claims ended without settling (did the process die running the handler?)", attempts-1))
	return c.handlerFailed(ctx, d, held, attempts, err), true
}

// runClaimed runs the handler under a claim and settles the outcome.
func (c *Consumer) runClaimed(ctx context.Context, d *delivery, held *idem.Held, attempts int) []*hold {
	if d.isLost() {
		return c.lostClaimed(ctx, d, held, errLost)
	}
	val, herr := c.runWithRetries(ctx, d, held)
	if herr == nil {
		if err := idem.ValidateResult(val); err != nil {
			// Retrying cannot shrink the result: fail the key for good.
			herr = idem.Permanent(fmt.Errorf("consumer: handler result cannot be recorded: %w", err))
		}
	}
	if herr != nil {
		if c.transient(herr) && d.isLost() && !lost(held) {
			// Not held for a delivery the broker redelivers: no
			// attempt is spent on it either.
			return c.lostClaimed(ctx, d, held, herr)
		}
		if c.transient(herr) && !lost(held) {
			ferr := c.unavailableTooLong(d, herr)
			if ferr == nil {
				return []*hold{c.holdClaimed(d, held, attempts, herr)}
			}
			herr = ferr
		}
		d.steps.releaseAll(ctx, herr)
		return c.handlerFailed(ctx, d, held, attempts, herr)
	}
	return c.completed(ctx, d, held, val, held.Complete(ctx, val))
}

// unavailableTooLong starts d's unavailability window at its first call
// and, once d has been held for its handler's system for
// MaxUnavailableHold, returns what herr becomes then: a failure that
// counts an attempt (no longer classified transient). nil: hold it.
func (c *Consumer) unavailableTooLong(d *delivery, herr error) error {
	if c.cfg.MaxUnavailableHold < 0 {
		return nil
	}
	now := time.Now()
	if d.unavailSince.IsZero() {
		d.unavailSince = now
		return nil
	}
	since := now.Sub(d.unavailSince)
	if since < c.cfg.MaxUnavailableHold {
		return nil
	}
	c.log.Warn("consumer: handler's system unavailable for longer than MaxUnavailableHold; counting it as a failed attempt",
		"msg_id", d.m.ID, "for", since, "max_unavailable_hold", c.cfg.MaxUnavailableHold, "err", herr)
	return fmt.Errorf("consumer: unavailable for %s, longer than MaxUnavailableHold %s: %v",
		since.Round(time.Millisecond), c.cfg.MaxUnavailableHold, herr)
}

// holdClaimed keeps d and its claim after a handler error classified as
// unavailability: the claim stays held (its lease kept by the guard's
// heartbeat) and the handler runs again later. Releasing it would make the
// next claim count one more attempt.
func (c *Consumer) holdClaimed(d *delivery, held *idem.Held, attempts int, herr error) *hold {
	return &hold{
		ds: []*delivery{d}, reason: HoldHandlerUnavailable, err: herr,
		wait: transientWait(herr),
		retry: func(ctx context.Context) []*hold {
			if d.isLost() {
				return c.lostClaimed(ctx, d, held, herr)
			}
			switch rerr := c.renew(ctx, held); {
			case lost(held):
				d.steps.releaseAll(ctx, herr)
				return c.claimLost(ctx, d, "claim lost while held")
			case rerr != nil:
				// Not known to be ours: the effect must not run again
				// yet. Keep the claim and wait for the store.
				h := c.holdClaimed(d, held, attempts, herr)
				h.reason, h.err, h.wait = HoldStoreUnavailable, rerr, 0
				return []*hold{h}
			}
			return c.runClaimed(ctx, d, held, attempts)
		},
		giveUp: func(ctx context.Context) {
			d.steps.releaseAll(ctx, herr)
			if err := held.Release(ctx, herr); err != nil {
				c.log.Warn("consumer: release at shutdown failed; the key is free once its lease lapses", "msg_id", d.m.ID, "err", err)
			}
			c.handBack(ctx, d, "handler unavailable at shutdown")
		},
	}
}

// renew verifies a claim kept across a hold before the handler runs
// again under it (idem.Held.Renew): its heartbeats may have failed for
// longer than its lease while the message was held, and another process
// may have taken the key over and run the effect. A claim found lost is
// then lost(h); another error means the store did not answer.
func (c *Consumer) renew(ctx context.Context, h *idem.Held) error {
	if err := h.Renew(ctx); err != nil {
		if !lost(h) {
			c.storeDown()
		}
		return err
	}
	c.storeAnswered()
	return nil
}

func lost(h *idem.Held) bool {
	select {
	case <-h.Done():
		return true
	default:
		return false
	}
}

func (c *Consumer) runWithRetries(ctx context.Context, d *delivery, held *idem.Held) ([]byte, error) {
	for try := 0; ; try++ {
		val, err := c.runHandler(ctx, d, held)
		if err == nil {
			return val, nil
		}
		err = c.classify(err)
		// A delivery lost meanwhile is not run again: its redelivered
		// copy is (checked again after the backoff's sleep).
		if c.transient(err) || d.isLost() || !c.retryInProcess(ctx, try, err, held) || d.isLost() {
			return nil, err
		}
	}
}

// retryInProcess sleeps before in-process retry number try+1 and reports
// whether to make it.
func (c *Consumer) retryInProcess(ctx context.Context, try int, err error, held *idem.Held) bool {
	if idem.IsPermanent(err) || try >= c.cfg.InProcessRetries || ctx.Err() != nil {
		return false
	}
	if held != nil && lost(held) {
		return false
	}
	wait := c.cfg.Backoff.Delay(try)
	if wait > c.cfg.InProcessMaxWait {
		return false // long waits go back to the broker
	}
	return sleep(ctx, wait)
}

// runHandler runs the handler with a context cancelled if the claim is
// lost, and turns a panic into an error.
func (c *Consumer) runHandler(ctx context.Context, d *delivery, held *idem.Held) (val []byte, err error) {
	hctx, stop := watchLease(withHeld(ctx, d, held.Token()), held)
	defer stop()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: handler panicked", "msg_id", d.m.ID, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("consumer: handler panicked: %v", r)
		}
	}()
	return c.cfg.Handler(hctx, d.m)
}

// handlerFailed releases the key and sends the message back to the broker
// with backoff, or dead-letters it once attempts are used up or the error
// is permanent.
func (c *Consumer) handlerFailed(ctx context.Context, d *delivery, held *idem.Held, attempts int, herr error) []*hold {
	cause := herr
	if attempts >= c.cfg.MaxAttempts && !idem.IsPermanent(herr) {
		cause = idem.Permanent(herr)
	}
	rerr := held.Release(ctx, cause)
	switch {
	case errors.Is(rerr, idem.ErrFailed):
		return c.deadLetter(ctx, d, fmt.Sprintf("handler failed after %d attempt(s): %v", attempts, herr))
	case errors.Is(rerr, idem.ErrFenced), errors.Is(rerr, idem.ErrNotFound):
		// The lease was lost while the handler ran (it was cancelled with
		// ErrLeaseLost): the new holder decides.
		return c.claimLost(ctx, d, "claim lost")
	case rerr != nil && idem.IsPermanent(cause):
		// The store did not record the key as failed; the guard keeps
		// trying in the background. The decision is made: dead-letter.
		c.storeDown()
		return c.deadLetter(ctx, d, fmt.Sprintf("handler failed after %d attempt(s): %v", attempts, herr))
	case rerr != nil:
		// The release did not reach the store: the key is freed when its
		// lease lapses (or the guard marks it failed in the background, if
		// its own WithMaxAttempts says so). Keep the message and claim it
		// again; until then an in-progress answer is our own claim, waited
		// for in process rather than with a nak. (A Held is never settled
		// twice.)
		c.storeDown()
		d.ownClaim = true
		return []*hold{{
			ds: []*delivery{d}, reason: HoldStoreUnavailable, err: rerr,
			retry:  func(ctx context.Context) []*hold { return c.restart(ctx, d) },
			giveUp: func(ctx context.Context) { c.handBack(ctx, d, "release failed at shutdown") },
		}}
	default:
		c.log.Info("consumer: handler failed; will retry", "msg_id", d.m.ID, "attempts", attempts, "err", herr)
		return c.nakOrHold(ctx, d, c.retryDelay(attempts), "handler failed")
	}
}

// claimLost: our claim was taken over or removed; the new holder decides,
// and a redelivery will find its outcome.
func (c *Consumer) claimLost(ctx context.Context, d *delivery, why string) []*hold {
	return c.nakOrHold(ctx, d, c.cfg.Backoff.Initial, why)
}

// retryDelay is the broker redelivery delay after attempt n (1-based).
func (c *Consumer) retryDelay(attempts int) time.Duration {
	return c.cfg.Backoff.Delay(max(attempts-1, 0) + c.cfg.InProcessRetries)
}

// completed settles a delivery after its effect, given Complete's error.
func (c *Consumer) completed(ctx context.Context, d *delivery, held *idem.Held, val []byte, err error) []*hold {
	switch {
	case err == nil:
		c.storeAnswered()
		c.stats.handled.Add(1)
		c.stats.duplicates.Add(int64(len(d.followers))) // same key later in the batch
		c.ack(ctx, d, false)
		return nil
	case errors.Is(err, idem.ErrResultTooLarge):
		// The effect ran; the guard marks the key failed (it never runs
		// again) because its result cannot be stored: a person looks at it.
		return c.deadLetter(ctx, d, err.Error())
	case errors.Is(err, idem.ErrUnrecorded):
		// The effect is done; acking avoids an immediate re-run. A
		// redelivery after the lease ends would run it again: logged.
		c.stats.unrecorded.Add(1)
		c.log.Error("consumer: effect done but not recorded; acking", "msg_id", d.m.ID, "key", string(d.key), "err", err)
		if c.cfg.Hooks.OnUnrecorded != nil {
			c.cfg.Hooks.OnUnrecorded(ctx, UnrecordedEvent{Msg: d.m, Key: d.key, Err: err})
		}
		c.ack(ctx, d, false)
		return nil
	case errors.Is(err, idem.ErrFenced), errors.Is(err, idem.ErrNotFound):
		// Our lease was taken over while the effect ran: the new holder
		// decides; a redelivery will find its outcome.
		c.log.Error("consumer: claim lost before completion; the effect may have run twice unless it checked the fencing token",
			"msg_id", d.m.ID, "key", string(d.key), "err", err)
		return c.claimLost(ctx, d, "claim lost")
	default:
		// Refused for good (the guard or store closed, an invalid
		// argument): never ack (invariant 5); keep the message and try
		// again (the guard handed nothing to the background, so the Held
		// may be settled again).
		c.storeDown()
		return []*hold{{
			ds: []*delivery{d}, reason: HoldStoreUnavailable, err: err,
			retry: func(ctx context.Context) []*hold {
				return c.completed(ctx, d, held, val, held.Complete(ctx, val))
			},
			giveUp: func(ctx context.Context) { c.handBack(ctx, d, "completion failed at shutdown") },
		}}
	}
}

// claimFailed settles (or holds) a delivery whose claim did not acquire
// the key.
func (c *Consumer) claimFailed(ctx context.Context, d *delivery, err error) []*hold {
	var inProg *idem.InProgressError
	switch {
	case errors.As(err, &inProg) && d.ownClaim:
		// Our own earlier claim, whose release did not go through.
		c.storeAnswered()
		return []*hold{{
			ds: []*delivery{d}, reason: HoldStoreUnavailable, err: err, wait: inProg.RetryAfter(time.Now()),
			retry:  func(ctx context.Context) []*hold { return c.restart(ctx, d) },
			giveUp: func(ctx context.Context) { c.handBack(ctx, d, "release failed at shutdown") },
		}}
	case errors.As(err, &inProg):
		// Never ack a duplicate of work in progress: it may still fail.
		c.storeAnswered()
		return c.nakOrHold(ctx, d, inProg.RetryAfter(time.Now()), "in progress elsewhere")
	case errors.Is(err, idem.ErrInProgress):
		return c.nakOrHold(ctx, d, c.cfg.Backoff.Initial, "in progress elsewhere")
	case errors.Is(err, idem.ErrFailed):
		c.storeAnswered()
		return c.deadLetter(ctx, d, err.Error())
	case errors.Is(err, idem.ErrFingerprintMismatch):
		c.storeAnswered()
		return c.deadLetter(ctx, d, "fingerprint mismatch: key reused with another payload")
	case errors.Is(err, idem.ErrInvalidKey):
		d.keyErr = fmt.Errorf("%w: %w", ErrNoKey, err)
		return c.missingKey(ctx, d)
	case errors.Is(err, idem.ErrInvalidArgument):
		// A fingerprint (or lease, TTL) the store refuses before any I/O:
		// no retry can fix it.
		return c.deadLetter(ctx, d, "claim refused: "+err.Error())
	default:
		// Fail closed: nothing ran, nothing is acked, and nothing goes
		// back to the broker (each nak would spend one of its
		// deliveries): the message is held until the store answers.
		c.storeDown()
		return []*hold{{
			ds: []*delivery{d}, reason: HoldStoreUnavailable, err: err,
			retry:  func(ctx context.Context) []*hold { return c.restart(ctx, d) },
			giveUp: func(ctx context.Context) { c.handBack(ctx, d, "store unavailable at shutdown") },
		}}
	}
}

func (c *Consumer) missingKey(ctx context.Context, d *delivery) []*hold {
	if c.cfg.MissingKey == MissingKeyReject {
		c.stats.deadLettered.Add(1)
		c.log.Error("consumer: message without a usable key rejected", "msg_id", d.m.ID, "topic", d.m.Topic, "err", d.keyErr)
		c.noteDeadLetter(ctx, d, "no usable key", "", nil)
		c.term(ctx, d, "no usable key")
		return nil
	}
	return c.deadLetter(ctx, d, d.keyErr.Error())
}

type settlingKey struct{}

// settling keeps acks and naks going through a shutdown: once the effect
// is done, telling the broker matters more than the caller's deadline. A
// context already made by settling is reused (one timer per batch, not
// per message).
func settling(ctx context.Context) (context.Context, context.CancelFunc) {
	return settlingFor(ctx, 1)
}

// settlingFor is settling for n messages: 10s plus 10ms per message.
func settlingFor(ctx context.Context, n int) (context.Context, context.CancelFunc) {
	if ctx.Value(settlingKey{}) != nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second+time.Duration(n)*10*time.Millisecond)
	return context.WithValue(ctx, settlingKey{}, true), cancel
}

// claim marks x settled; false if it was already. The caller then calls
// the broker and done.
func (c *Consumer) claim(x *delivery) bool { return x.settled.CompareAndSwap(false, true) }

// done ends a settled delivery: it leaves the in-flight set and frees its
// MaxInFlight slot (after the broker call, so fetching never runs ahead of
// what the broker sees settled).
func (c *Consumer) done(x *delivery) {
	if c.inflight != nil {
		c.inflight.remove(x)
	}
	if x.held.Load() {
		c.stats.heldNow.Add(-1)
	}
	c.stats.inFlight.Add(-1)
	c.win.release(1)
}

// ack acks d and its followers; dup says d itself was a duplicate.
func (c *Consumer) ack(ctx context.Context, d *delivery, dup bool) {
	ctx, cancel := settling(ctx)
	defer cancel()
	c.ackOne(ctx, d, dup)
	for _, x := range d.followers {
		c.ackOne(ctx, x, true)
	}
}

func (c *Consumer) ackOne(ctx context.Context, x *delivery, dup bool) {
	if !c.claim(x) {
		return
	}
	if err := x.m.Acker.Ack(ctx); c.settleFailed(x, err, "ack") {
		c.log.Warn("consumer: ack failed; the broker will redeliver and the guard replay", "msg_id", x.m.ID, "err", err)
	}
	if c.cfg.Hooks.OnAck != nil {
		c.cfg.Hooks.OnAck(ctx, AckEvent{Msg: x.m, Duplicate: dup})
	}
	c.done(x)
}

func (c *Consumer) nak(ctx context.Context, d *delivery, delay time.Duration, why string) {
	ctx, cancel := settling(ctx)
	defer cancel()
	for _, x := range d.self() {
		if !c.claim(x) {
			continue
		}
		c.stats.naked.Add(1)
		if err := x.m.Acker.Nak(ctx, delay); c.settleFailed(x, err, "nak") {
			c.log.Warn("consumer: nak failed; the broker redelivers after its ack wait", "msg_id", x.m.ID, "why", why, "err", err)
		}
		if c.cfg.Hooks.OnNak != nil {
			c.cfg.Hooks.OnNak(ctx, NakEvent{Msg: x.m, Delay: delay, Reason: why})
		}
		c.done(x)
	}
}

func (c *Consumer) term(ctx context.Context, d *delivery, reason string) {
	ctx, cancel := settling(ctx)
	defer cancel()
	for _, x := range d.self() {
		if !c.claim(x) {
			continue
		}
		if err := x.m.Acker.Term(ctx, idem.TruncateCause(reason)); c.settleFailed(x, err, "term") {
			c.log.Warn("consumer: term failed", "msg_id", x.m.ID, "err", err)
		}
		c.done(x)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
