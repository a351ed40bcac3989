package consumer

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"math"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// Headers added to dead-lettered messages.
const (
	HeaderDeadLetterReason = "idem-dead-letter-reason"
	HeaderOriginalTopic    = "idem-original-topic"
	HeaderOriginalID       = "idem-original-id"
	HeaderDelivery         = "idem-delivery"
)

// Stats counts what a Consumer did with its deliveries.
type Stats struct {
	Handled      int64 // handler ran and its completion was recorded; acked
	Duplicates   int64 // key already completed; acked without running
	Naked        int64 // sent back to the broker with a delay
	DeadLettered int64 // published to the dead-letter topic (or rejected) and terminated
	StoreErrors  int64 // claims or settles that failed on the store (fail closed)
	Unrecorded   int64 // effect done, completion not recorded; acked and logged
	SettleErrors int64 // ack/nak/term calls the broker refused
}

type counters struct {
	handled, duplicates, naked, deadLettered, storeErrors, unrecorded, settleErrors atomic.Int64
}

// Consumer runs a handler over a subscriber's deliveries through the
// guard. Create it with New and start it with Run.
type Consumer struct {
	cfg   Config
	log   *slog.Logger
	seed  maphash.Seed
	win   *window
	stats counters
	ran   atomic.Bool
	// pausedUntil (unix nanos): the store failed; fetching waits until
	// then instead of naking the whole backlog, since each nak costs a
	// delivery against the broker's MaxDeliver.
	pausedUntil atomic.Int64
}

// storeDown records a store failure: fetching pauses for StoreDownDelay.
func (c *Consumer) storeDown() {
	c.stats.storeErrors.Add(1)
	c.pausedUntil.Store(time.Now().Add(c.cfg.StoreDownDelay).UnixNano())
}

// delivery is one fetched message on its way through a worker.
type delivery struct {
	m         *broker.Message
	key       []byte
	keyErr    error
	fp        []byte
	followers []*delivery // same key later in the same batch: settled like this one
}

// New checks cfg and returns a Consumer. It warns (through the guard's
// logger) when the guard's record TTL is shorter than the subscriber's
// redelivery window plus MaxAttempts naks of Backoff.Max (invariant 6).
func New(cfg Config) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if w := cfg.Subscriber.RedeliveryWindow(); w > 0 {
		// Our own nak delays stretch the broker's window.
		naks := time.Duration(cfg.MaxAttempts) * cfg.Backoff.Max
		if w <= math.MaxInt64-naks {
			w += naks
		}
		_ = cfg.Guard.CheckRedeliveryWindow(w)
	}
	return &Consumer{
		cfg:  cfg,
		log:  cfg.Logger,
		seed: maphash.MakeSeed(),
		win:  newWindow(cfg.MaxInFlight),
	}, nil
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Handled: s.handled.Load(), Duplicates: s.duplicates.Load(), Naked: s.naked.Load(),
		DeadLettered: s.deadLettered.Load(), StoreErrors: s.storeErrors.Load(),
		Unrecorded: s.unrecorded.Load(), SettleErrors: s.settleErrors.Load(),
	}
}

// Run fetches and handles messages until ctx ends or the subscriber is
// closed, then drains: messages already fetched are handled and settled
// within ShutdownTimeout (handlers keep a live context until then), the
// rest are nak'ed. It returns nil after a shutdown through ctx,
// broker.ErrClosed if the subscriber was closed under it. Run may be
// called once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	queues := make([]chan *delivery, c.cfg.Workers)
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan *delivery, c.cfg.MaxInFlight)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.cfg.BatchHandler != nil || c.cfg.TxBatchHandler != nil {
				c.batchWorker(workCtx, queues[i])
			} else {
				c.worker(workCtx, queues[i])
			}
		}()
	}
	runErr := c.fetchLoop(ctx, queues)
	for _, q := range queues {
		close(q)
	}
	// Drain; past the deadline workers nak what is left (workCtx done).
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
		if d := time.Until(time.Unix(0, c.pausedUntil.Load())); d > 0 {
			c.log.Debug("consumer: store down; fetching paused", "for", d)
			if !sleep(ctx, d) {
				c.win.release(n)
				return nil
			}
		}
		msgs, err := c.cfg.Subscriber.Fetch(ctx, n)
		if len(msgs) > n {
			c.win.take(len(msgs) - n) // an adapter that overshot max
		} else {
			c.win.release(n - len(msgs))
		}
		for _, m := range msgs {
			d := c.prepare(m)
			queues[c.workerFor(m, d)] <- d
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

func (c *Consumer) prepare(m *broker.Message) (d *delivery) {
	d = &delivery{m: m}
	defer func() {
		// User key, fingerprint and order functions run on the fetch
		// loop: a panic there must not take the consumer down.
		if r := recover(); r != nil {
			c.log.Error("consumer: key or fingerprint function panicked", "msg_id", m.ID, "panic", r)
			d.key, d.fp = nil, nil
			d.keyErr = fmt.Errorf("%w: key function panicked: %v", ErrNoKey, r)
		}
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

// workerFor routes a delivery: equal order keys go to the same worker.
func (c *Consumer) workerFor(m *broker.Message, d *delivery) (w int) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: order key function panicked", "msg_id", m.ID, "panic", r)
			w = 0
		}
	}()
	k := c.cfg.OrderKey(m, d.key)
	if len(k) == 0 {
		return 0
	}
	return int(maphash.Bytes(c.seed, k) % uint64(c.cfg.Workers))
}

func (c *Consumer) worker(ctx context.Context, q <-chan *delivery) {
	for d := range q {
		if ctx.Err() != nil {
			c.nak(ctx, d, 0, "shutdown timeout")
		} else {
			c.handleOne(ctx, d)
		}
		c.win.release(1)
	}
}

// handleOne runs one delivery through the guard and settles it.
func (c *Consumer) handleOne(ctx context.Context, d *delivery) {
	ctx = broker.ExtractTrace(ctx, d.m)
	if d.keyErr != nil {
		c.missingKey(ctx, d)
		return
	}
	held, res, err := c.cfg.Guard.Acquire(ctx, d.key, idem.WithFingerprint(d.fp))
	if err != nil {
		c.claimFailed(ctx, d, err)
		return
	}
	if held == nil {
		c.stats.duplicates.Add(1)
		c.ack(ctx, d)
		return
	}
	val, herr := c.runWithRetries(ctx, d, held)
	if herr == nil {
		if err := idem.ValidateResult(val); err != nil {
			// Retrying cannot shrink the result: fail the key for good.
			herr = idem.Permanent(fmt.Errorf("consumer: handler result cannot be recorded: %w", err))
		}
	}
	if herr != nil {
		c.handlerFailed(ctx, d, held, res.Attempts, herr)
		return
	}
	c.completed(ctx, d, held.Complete(ctx, val))
}

func (c *Consumer) runWithRetries(ctx context.Context, d *delivery, held *idem.Held) ([]byte, error) {
	for try := 0; ; try++ {
		val, err := c.runHandler(ctx, d, held)
		if err == nil {
			return val, nil
		}
		if !c.retryInProcess(ctx, try, err, held) {
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
	if held != nil {
		select {
		case <-held.Done():
			return false
		default:
		}
	}
	wait := c.cfg.Backoff.Delay(try)
	if wait > c.cfg.InProcessMaxWait {
		return false // long waits go back to the broker
	}
	return sleep(ctx, wait)
}

// runHandler runs the handler with a context cancelled if the claim is
// lost, telling the broker the message is in progress meanwhile, and turns
// a panic into an error.
func (c *Consumer) runHandler(ctx context.Context, d *delivery, held *idem.Held) (val []byte, err error) {
	hctx, cancel := context.WithCancelCause(withHeld(ctx, d.key, held.Token()))
	stop := c.keepAlive(hctx, cancel, held, d)
	defer stop()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("consumer: handler panicked", "msg_id", d.m.ID, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("consumer: handler panicked: %v", r)
		}
	}()
	return c.cfg.Handler(hctx, d.m)
}

// keepAliveDelay: handlers faster than this get no watcher goroutine; a
// lease lost that early only shows as a fenced completion, which is
// handled the same way.
const keepAliveDelay = 50 * time.Millisecond

// keepAlive cancels ctx when held is lost and sends InProgress for the
// deliveries while the handler runs; the watcher starts only once the
// handler has run for keepAliveDelay (or InProgressInterval, if shorter).
// stop ends it and waits.
func (c *Consumer) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, held *idem.Held, ds ...*delivery) (stop func()) {
	var (
		mu           sync.Mutex
		stopped      bool
		done, exited chan struct{}
	)
	delay := keepAliveDelay
	if c.cfg.InProgressInterval > 0 {
		delay = min(delay, c.cfg.InProgressInterval)
	}
	t := time.AfterFunc(delay, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		done, exited = make(chan struct{}), make(chan struct{})
		go c.watch(ctx, cancel, held, ds, done, exited)
	})
	return func() {
		t.Stop()
		mu.Lock()
		stopped = true
		d, e := done, exited
		mu.Unlock()
		if d != nil {
			close(d)
			<-e
		}
		cancel(nil)
	}
}

func (c *Consumer) watch(ctx context.Context, cancel context.CancelCauseFunc, held *idem.Held, ds []*delivery, done, exited chan struct{}) {
	defer close(exited)
	var lost <-chan struct{}
	if held != nil {
		lost = held.Done()
	}
	var tick <-chan time.Time
	if c.cfg.InProgressInterval > 0 {
		tk := time.NewTicker(c.cfg.InProgressInterval)
		defer tk.Stop()
		tick = tk.C
	}
	for {
		select {
		case <-done:
			return
		case <-lost:
			cancel(idem.ErrLeaseLost)
			lost = nil
		case <-tick:
			for _, d := range ds {
				if err := d.m.Acker.InProgress(ctx); err != nil {
					c.log.Warn("consumer: in-progress heartbeat failed", "msg_id", d.m.ID, "err", err)
				}
			}
		}
	}
}

// handlerFailed releases the key and sends the message back to the broker
// with backoff, or dead-letters it once attempts are used up or the error
// is permanent.
func (c *Consumer) handlerFailed(ctx context.Context, d *delivery, held *idem.Held, attempts int, herr error) {
	cause := herr
	if attempts >= c.cfg.MaxAttempts && !idem.IsPermanent(herr) {
		cause = idem.Permanent(herr)
	}
	rerr := held.Release(ctx, cause)
	switch {
	case errors.Is(rerr, idem.ErrFailed):
		c.deadLetter(ctx, d, fmt.Sprintf("handler failed after %d attempt(s): %v", attempts, herr))
	case errors.Is(rerr, idem.ErrFenced), errors.Is(rerr, idem.ErrNotFound):
		// The lease was lost while the handler ran (it was cancelled with
		// ErrLeaseLost): the new holder decides.
		c.nak(ctx, d, c.cfg.Backoff.Initial, "claim lost")
	case rerr != nil:
		// The key stays in progress until its lease ends; come back then.
		c.storeDown()
		c.log.Warn("consumer: release after handler failure failed", "msg_id", d.m.ID, "err", rerr, "handler_err", herr)
		c.nak(ctx, d, c.cfg.StoreDownDelay, "release failed")
	default:
		c.log.Info("consumer: handler failed; will retry", "msg_id", d.m.ID, "attempts", attempts, "err", herr)
		c.nak(ctx, d, c.retryDelay(attempts), "handler failed")
	}
}

// retryDelay is the broker redelivery delay after attempt n (1-based).
func (c *Consumer) retryDelay(attempts int) time.Duration {
	return c.cfg.Backoff.Delay(max(attempts-1, 0) + c.cfg.InProcessRetries)
}

// completed settles a delivery after its effect, given Complete's error.
func (c *Consumer) completed(ctx context.Context, d *delivery, err error) {
	switch {
	case err == nil:
		c.stats.handled.Add(1)
		c.stats.duplicates.Add(int64(len(d.followers))) // same key later in the batch
		c.ack(ctx, d)
	case errors.Is(err, idem.ErrUnrecorded):
		// The effect is done; acking avoids an immediate re-run. A
		// redelivery after the lease ends would run it again: logged.
		c.stats.unrecorded.Add(1)
		c.log.Error("consumer: effect done but not recorded; acking", "msg_id", d.m.ID, "key", string(d.key), "err", err)
		c.ack(ctx, d)
	case errors.Is(err, idem.ErrFenced), errors.Is(err, idem.ErrNotFound):
		// Our lease was taken over while the effect ran: the new holder
		// decides; a redelivery will find its outcome.
		c.log.Error("consumer: claim lost before completion; the effect may have run twice unless it checked the fencing token",
			"msg_id", d.m.ID, "key", string(d.key), "err", err)
		c.nak(ctx, d, c.cfg.Backoff.Initial, "claim lost")
	default:
		c.storeDown()
		c.log.Warn("consumer: complete failed", "msg_id", d.m.ID, "err", err)
		c.nak(ctx, d, c.cfg.StoreDownDelay, "complete failed")
	}
}

// claimFailed settles a delivery whose claim did not acquire the key.
func (c *Consumer) claimFailed(ctx context.Context, d *delivery, err error) {
	var inProg *idem.InProgressError
	switch {
	case errors.As(err, &inProg):
		// Never ack a duplicate of work in progress: it may still fail.
		c.nak(ctx, d, inProg.RetryAfter(time.Now()), "in progress elsewhere")
	case errors.Is(err, idem.ErrInProgress):
		c.nak(ctx, d, c.cfg.Backoff.Initial, "in progress elsewhere")
	case errors.Is(err, idem.ErrFailed):
		c.deadLetter(ctx, d, err.Error())
	case errors.Is(err, idem.ErrFingerprintMismatch):
		c.deadLetter(ctx, d, "fingerprint mismatch: key reused with another payload")
	case errors.Is(err, idem.ErrInvalidKey):
		d.keyErr = fmt.Errorf("%w: %w", ErrNoKey, err)
		c.missingKey(ctx, d)
	default:
		// Fail closed: nothing ran, nothing is acked.
		c.storeDown()
		c.log.Warn("consumer: claim failed; failing closed", "msg_id", d.m.ID, "err", err, "retry_in", c.cfg.StoreDownDelay)
		c.nak(ctx, d, c.cfg.StoreDownDelay, "store unavailable")
	}
}

func (c *Consumer) missingKey(ctx context.Context, d *delivery) {
	if c.cfg.MissingKey == MissingKeyReject {
		c.stats.deadLettered.Add(1)
		c.log.Error("consumer: message without a usable key rejected", "msg_id", d.m.ID, "topic", d.m.Topic, "err", d.keyErr)
		c.term(ctx, d, "no usable key")
		return
	}
	c.deadLetter(ctx, d, d.keyErr.Error())
}

// deadLetter publishes d to the dead-letter topic once, then terminates
// it. The publish runs through the guard under key+"/dead-letter", so a
// redelivery or a duplicate of a failed key does not publish again; the
// dead-letter message's id is fixed too, for brokers that dedup.
func (c *Consumer) deadLetter(ctx context.Context, d *delivery, reason string) {
	m := d.m
	if c.cfg.DeadLetter == nil {
		c.stats.deadLettered.Add(1)
		c.log.Error("consumer: poison message terminated (no dead-letter publisher configured)", "msg_id", m.ID, "topic", m.Topic, "reason", reason)
		c.term(ctx, d, reason)
		return
	}
	dl := &broker.Message{
		ID:      deadLetterID(m),
		Topic:   c.cfg.DeadLetterTopic(m),
		Key:     m.Key,
		Headers: maps.Clone(m.Headers),
		Payload: m.Payload,
	}
	if dl.Headers == nil {
		dl.Headers = map[string]string{}
	}
	dl.Headers[HeaderDeadLetterReason] = idem.TruncateCause(reason)
	dl.Headers[HeaderOriginalTopic] = m.Topic
	dl.Headers[HeaderOriginalID] = m.ID
	dl.Headers[HeaderDelivery] = strconv.Itoa(m.Delivery)
	publish := func(ctx context.Context) ([]byte, error) { return nil, c.cfg.DeadLetter.Publish(ctx, dl) }
	var err error
	if d.keyErr == nil {
		_, err = c.cfg.Guard.Do(ctx, deadLetterKey(d.key), publish)
	} else {
		// No key to guard with: the fixed dead-letter id is all there is.
		_, err = publish(ctx)
	}
	var inProg *idem.InProgressError
	switch {
	case err == nil:
		c.stats.deadLettered.Add(1)
		c.log.Warn("consumer: message dead-lettered", "msg_id", m.ID, "topic", m.Topic, "dead_letter_topic", dl.Topic, "reason", reason)
		c.term(ctx, d, reason)
	case errors.As(err, &inProg):
		c.nak(ctx, d, inProg.RetryAfter(time.Now()), "dead-letter in progress elsewhere")
	default:
		c.storeDown()
		c.log.Error("consumer: dead-letter publish failed; will retry", "msg_id", m.ID, "err", err)
		c.nak(ctx, d, c.cfg.StoreDownDelay, "dead-letter failed")
	}
}

func deadLetterID(m *broker.Message) string {
	if m.ID != "" {
		return m.ID + "/dead-letter"
	}
	return "dead-letter-" + hex.EncodeToString(idem.FingerprintOf([]byte(m.Topic), m.Payload))[:32]
}

func deadLetterKey(key []byte) []byte { return derivedKey(key, "dead-letter") }

// derivedKey is key+"/"+suffix, or a hash of it when that is too long.
func derivedKey(key []byte, suffix string) []byte {
	k := make([]byte, 0, len(key)+1+len(suffix))
	k = append(append(append(k, key...), '/'), suffix...)
	if len(k) <= idem.MaxKeyLen {
		return k
	}
	return []byte("sha256:" + hex.EncodeToString(idem.FingerprintOf(k)))
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

func (c *Consumer) ack(ctx context.Context, d *delivery) {
	ctx, cancel := settling(ctx)
	defer cancel()
	c.ackOne(ctx, d)
	for _, x := range d.followers {
		c.ackOne(ctx, x)
	}
}

func (c *Consumer) ackOne(ctx context.Context, x *delivery) {
	if err := x.m.Acker.Ack(ctx); err != nil {
		c.stats.settleErrors.Add(1)
		c.log.Warn("consumer: ack failed; the broker will redeliver and the guard replay", "msg_id", x.m.ID, "err", err)
	}
}

func (c *Consumer) nak(ctx context.Context, d *delivery, delay time.Duration, why string) {
	ctx, cancel := settling(ctx)
	defer cancel()
	for _, x := range append([]*delivery{d}, d.followers...) {
		c.stats.naked.Add(1)
		if err := x.m.Acker.Nak(ctx, delay); err != nil {
			c.stats.settleErrors.Add(1)
			c.log.Warn("consumer: nak failed; the broker redelivers after its ack wait", "msg_id", x.m.ID, "why", why, "err", err)
		}
	}
}

func (c *Consumer) term(ctx context.Context, d *delivery, reason string) {
	ctx, cancel := settling(ctx)
	defer cancel()
	for _, x := range append([]*delivery{d}, d.followers...) {
		if err := x.m.Acker.Term(ctx, idem.TruncateCause(reason)); err != nil {
			c.stats.settleErrors.Add(1)
			c.log.Warn("consumer: term failed", "msg_id", x.m.ID, "err", err)
		}
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

type heldKey struct{}

type heldInfo struct {
	key   []byte
	token uint64
}

func withHeld(ctx context.Context, key []byte, token uint64) context.Context {
	return context.WithValue(ctx, heldKey{}, heldInfo{key: key, token: token})
}

// KeyFromContext returns the idempotency key of the message whose handler
// runs with ctx.
func KeyFromContext(ctx context.Context) ([]byte, bool) {
	h, ok := ctx.Value(heldKey{}).(heldInfo)
	return h.key, ok
}

// TokenFromContext returns the fencing token of the claim under which the
// handler runs (0 in batch mode, where each message has its own: see
// BatchTokens). Pass it to the effect's store when it can check it.
func TokenFromContext(ctx context.Context) (uint64, bool) {
	h, ok := ctx.Value(heldKey{}).(heldInfo)
	return h.token, ok && h.token != 0
}
