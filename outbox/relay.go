package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// Defaults of a relay Config.
const (
	DefaultBatchSize      = 256
	DefaultMaxAttempts    = 3 // seed 000
	DefaultPublishTimeout = 10 * time.Second
	DefaultPollInterval   = 100 * time.Millisecond // backends without notifications
	DefaultNotifyPoll     = time.Second            // safety net beside notifications
	DefaultRetention      = 24 * time.Hour
	DefaultPurgeInterval  = time.Minute
	DefaultPurgeBatch     = 1000
	DefaultStatsInterval  = 10 * time.Second
	DefaultSettleTimeout  = 10 * time.Second

	// Unlimited, as Config.MaxAttempts, retries for ever.
	Unlimited = -1

	minErrorDelay = 100 * time.Millisecond
	maxErrorDelay = 5 * time.Second
)

// Hooks observe a Relay (metrics, alerts, tracing). Nil fields are skipped.
// They run on the relay's goroutines and must not block for long.
type Hooks struct {
	// OnPublished: rows of a batch were published and marked sent. Each
	// row's Attempts counts this attempt; At - CreatedAt is its
	// commit-to-publish latency (on one clock only when relay and backend
	// share it).
	OnPublished func(ctx context.Context, e PublishedEvent)
	// OnRetry: a row's publish failed and it was rescheduled.
	OnRetry func(ctx context.Context, e RetryEvent)
	// OnFailed: a row used up its attempts and is now StatusFailed: the
	// alert. The row stays in the outbox until re-queued (Backend.Requeue).
	OnFailed func(ctx context.Context, e FailedEvent)
	// OnStats: a periodic snapshot (every StatsInterval): backlog, oldest
	// unsent age (Stats.OldestAge), failed count.
	OnStats func(ctx context.Context, s Stats)
	// OnError: the relay's own operation op ("claim", "settle", "purge",
	// "stats", "listen") failed; it backs off and retries.
	OnError func(ctx context.Context, op string, err error)
}

// PublishedEvent describes rows published in one batch.
type PublishedEvent struct {
	Rows     []Row         // as settled: StatusSent, Attempts including this one
	Duration time.Duration // the publish call(s)
	At       time.Time     // the relay's clock after publishing
}

// RetryEvent describes one rescheduled row.
type RetryEvent struct {
	Row   Row // Attempts including the failed one
	Delay time.Duration
	Err   error
	// Outage: the round was a broker outage (the broker took none of its
	// messages and every failure was the broker's absence: Err wraps
	// idem.ErrUnavailable, idem.ErrUnknownOutcome or a deadline, and not
	// broker.ErrRejected). The attempt is counted in Row.Attempts but
	// MaxAttempts does not fail the row.
	Outage bool
}

// FailedEvent describes one row marked failed.
type FailedEvent struct {
	Row Row // Attempts including the last one
	Err error
}

// Config configures a Relay. Backend and Publisher are required.
type Config struct {
	Backend Backend
	// Publisher sends the messages; its Publish must return only once the
	// broker durably has them (broker.Publisher's contract). The message
	// ID is the broker's dedup id where the broker has one.
	Publisher broker.Publisher
	// BatchSize is how many rows one claim takes (default 256, at most
	// 10,000).
	BatchSize int
	// Concurrency is how many claim loops run in this relay (default 1).
	// Loops, like relays in other processes, never share a row.
	Concurrency int
	// Ordered keeps per-key order: a key's later message is claimed only
	// after the earlier one was sent or failed (Backend.Claim).
	Ordered bool
	// MaxAttempts before a row is marked failed (default 3, seed 000;
	// Unlimited: retry for ever). Rounds that are a broker outage (see
	// RetryEvent.Outage) count attempts but fail no row: an outage of
	// any length spends no message's attempts.
	MaxAttempts int
	// Backoff between attempts (default 1s x1.5, at most 10s, +10% jitter).
	Backoff Backoff
	// PublishTimeout bounds one batch's publishing (default 10s); rows not
	// published by then count a failed attempt.
	PublishTimeout time.Duration
	// PollInterval is how long an idle relay waits before looking again
	// (default 100ms; 1s when the backend notifies, as a safety net).
	PollInterval time.Duration
	// Retention is how long sent rows are kept (default 24h; negative:
	// for ever). PurgeInterval (default 1m) and PurgeBatch (default 1000
	// rows per statement) pace their removal.
	Retention     time.Duration
	PurgeInterval time.Duration
	PurgeBatch    int
	// StatsInterval paces Hooks.OnStats (default 10s; negative: off).
	StatsInterval time.Duration
	// Clock, when set, is passed to the backend as the time of claims and
	// settlements (tests of the backoff schedule inject one). Unset, the
	// backend uses its own clock.
	Clock idem.Clock
	// Rand returns jitter in [0, 1) (default math/rand/v2.Float64).
	Rand   func() float64
	Logger *slog.Logger
	Hooks  Hooks
}

func (c Config) withDefaults() Config {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	c.Backoff = c.Backoff.withDefaults()
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
		if notifierOf(c.Backend) != nil {
			c.PollInterval = DefaultNotifyPoll
		}
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.PurgeInterval == 0 {
		c.PurgeInterval = DefaultPurgeInterval
	}
	if c.PurgeBatch == 0 {
		c.PurgeBatch = DefaultPurgeBatch
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks the configuration after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Backend == nil:
		return invalid("relay: Backend is required")
	case c.Publisher == nil:
		return invalid("relay: Publisher is required")
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return invalid("relay: batch size %d outside [1, 10000]", c.BatchSize)
	case c.Concurrency < 1 || c.Concurrency > 256:
		return invalid("relay: concurrency %d outside [1, 256]", c.Concurrency)
	case c.MaxAttempts < Unlimited:
		return invalid("relay: max attempts %d (want >= 1, or Unlimited)", c.MaxAttempts)
	case c.PublishTimeout < time.Millisecond:
		return invalid("relay: publish timeout %s < 1ms", c.PublishTimeout)
	case c.PollInterval < time.Millisecond:
		return invalid("relay: poll interval %s < 1ms", c.PollInterval)
	case c.Retention > 0 && c.Retention < time.Second:
		return invalid("relay: retention %s < 1s", c.Retention)
	case c.PurgeInterval < time.Millisecond:
		return invalid("relay: purge interval %s < 1ms", c.PurgeInterval)
	case c.PurgeBatch < 1:
		return invalid("relay: purge batch %d < 1", c.PurgeBatch)
	}
	return c.Backoff.Validate()
}

// Relay moves committed outbox rows to the broker: it claims due rows in
// batches, publishes them, marks them sent, and reschedules or fails the
// ones whose publish failed. Run any number of relays (processes, or
// Concurrency loops) on one outbox; they never share a row.
type Relay struct {
	cfg      Config
	notifier Notifier
	running  atomic.Bool

	mu    sync.Mutex
	wakes []chan struct{}
}

// New checks cfg and returns a relay.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg.withDefaults()}
	r.notifier = notifierOf(cfg.Backend)
	return r, nil
}

// Wake makes idle claim loops look for due rows now (a producer in the same
// process can call it after its transaction commits).
func (r *Relay) Wake() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range r.wakes {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Run relays until ctx is done, then returns nil (a batch being published
// is settled first). It fails at once when the relay is already running.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: outbox: relay already running", idem.ErrInvalidArgument)
	}
	defer r.running.Store(false)
	var wg sync.WaitGroup
	wakes := make([]chan struct{}, r.cfg.Concurrency)
	for i := range wakes {
		wakes[i] = make(chan struct{}, 1)
	}
	r.mu.Lock()
	r.wakes = wakes
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.wakes = nil
		r.mu.Unlock()
	}()
	if r.notifier != nil {
		wg.Go(func() { r.listen(ctx) })
	}
	if r.cfg.Retention > 0 {
		wg.Go(func() { r.every(ctx, r.cfg.PurgeInterval, "purge", r.purge) })
	}
	if r.cfg.Hooks.OnStats != nil && r.cfg.StatsInterval > 0 {
		wg.Go(func() { r.every(ctx, r.cfg.StatsInterval, "stats", r.stats) })
	}
	for _, wake := range wakes {
		wg.Go(func() { r.loop(ctx, wake) })
	}
	wg.Wait()
	return nil
}

func (r *Relay) loop(ctx context.Context, wake <-chan struct{}) {
	t := time.NewTimer(0)
	defer t.Stop()
	errDelay := time.Duration(0)
	for ctx.Err() == nil {
		n, err := r.RunOnce(ctx)
		wait := r.cfg.PollInterval
		switch {
		case err != nil:
			errDelay = min(max(2*errDelay, minErrorDelay), maxErrorDelay)
			wait = errDelay
		case n == r.cfg.BatchSize:
			errDelay = 0
			continue // a full batch: more may be due
		default:
			errDelay = 0
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-wake:
			if err != nil { // the backend is failing: keep backing off
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// listen runs the backend's notifications; after a permanent failure the
// relay falls back to polling.
func (r *Relay) listen(ctx context.Context) {
	if err := r.notifier.Listen(ctx, r.Wake); err != nil && ctx.Err() == nil {
		r.opError(ctx, "listen", err)
	}
}

func (r *Relay) every(ctx context.Context, d time.Duration, op string, f func(context.Context) error) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := f(ctx); err != nil && ctx.Err() == nil {
			r.opError(ctx, op, err)
		}
	}
}

func (r *Relay) opError(ctx context.Context, op string, err error) {
	r.cfg.Logger.Warn("outbox relay: "+op+" failed", "err", err)
	if f := r.cfg.Hooks.OnError; f != nil {
		f(ctx, op, err)
	}
}

// now is the time passed to the backend: the injected clock's, else zero
// (the backend's own clock).
func (r *Relay) now() time.Time {
	if r.cfg.Clock == nil {
		return time.Time{}
	}
	return r.cfg.Clock.Now()
}

func (r *Relay) clockNow() time.Time {
	if r.cfg.Clock == nil {
		return time.Now()
	}
	return r.cfg.Clock.Now()
}

// RunOnce claims one batch, publishes it and settles it, and returns how
// many rows it claimed. Run calls it in a loop; tests and callers that
// schedule the relay themselves can call it directly.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	b, err := r.cfg.Backend.Claim(ctx, ClaimRequest{Limit: r.cfg.BatchSize, Now: r.now(), Ordered: r.cfg.Ordered, Hold: r.hold()})
	if err != nil {
		if ctx.Err() == nil {
			r.opError(ctx, "claim", err)
		}
		return 0, err
	}
	rows := b.Rows()
	// Settling and releasing must outlive a shutdown that starts
	// mid-publish (a row the broker has should be marked sent), and each
	// gets its whole timeout when it starts: counted from the claim, a
	// publish taking longer than it would leave the settlement an expired
	// context, and the batch would be published again on every round.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultSettleTimeout)
		defer cancel()
		_ = b.Release(rctx) // a no-op after Settle
	}()
	if len(rows) == 0 {
		return 0, nil
	}
	start := r.clockNow()
	errs, failed := r.publishGood(ctx, rows)
	at := r.clockNow()
	s := Settlement{Now: r.now()}
	if ctx.Err() != nil && failed {
		// Shut down mid-publish: the failures say nothing about the
		// messages. Mark what the broker took sent; the rows not named
		// are freed unchanged for the next relay.
		for i, row := range rows {
			if errs[i] == nil {
				s.Sent = append(s.Sent, row.Seq)
			}
		}
		if len(s.Sent) > 0 {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultSettleTimeout)
			defer cancel()
			if err := b.Settle(sctx, s); err != nil {
				r.opError(ctx, "settle", err)
			}
		}
		return len(rows), nil
	}
	var sent []Row
	var retries []RetryEvent
	var fails []FailedEvent
	outage := isOutage(rows, errs)
	for i, row := range rows {
		row.Attempts++
		row.UpdatedAt = at
		if errs == nil || errs[i] == nil {
			s.Sent = append(s.Sent, row.Seq)
			row.Status = StatusSent
			sent = append(sent, row)
			continue
		}
		msg := TruncateError(errs[i].Error())
		row.LastError = msg
		if row.Bad != "" || !outage && r.cfg.MaxAttempts != Unlimited && row.Attempts >= r.cfg.MaxAttempts {
			s.Failed = append(s.Failed, Failure{Seq: row.Seq, Err: msg})
			row.Status = StatusFailed
			fails = append(fails, FailedEvent{Row: row, Err: errs[i]})
			continue
		}
		d := r.cfg.Backoff.Delay(row.Attempts, r.cfg.Rand())
		s.Retry = append(s.Retry, Retry{Seq: row.Seq, Delay: d, Err: msg})
		row.NextAttemptAt = at.Add(d)
		retries = append(retries, RetryEvent{Row: row, Delay: d, Err: errs[i], Outage: outage && row.Bad == ""})
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultSettleTimeout)
	defer cancel()
	if err := b.Settle(sctx, s); err != nil {
		r.opError(ctx, "settle", err)
		return len(rows), err
	}
	h := r.cfg.Hooks
	if h.OnPublished != nil && len(sent) > 0 {
		h.OnPublished(ctx, PublishedEvent{Rows: sent, Duration: at.Sub(start), At: at})
	}
	if outage && len(retries) > 0 {
		r.cfg.Logger.Warn("outbox relay: broker outage: no message published, rows rescheduled without using up their attempts", "rows", len(retries), "delay", retries[0].Delay, "err", retries[0].Err)
	}
	for _, e := range retries {
		if !e.Outage {
			r.cfg.Logger.Info("outbox relay: publish failed, rescheduled", "id", e.Row.ID, "topic", e.Row.Topic, "attempts", e.Row.Attempts, "delay", e.Delay, "err", e.Err)
		}
		if h.OnRetry != nil {
			h.OnRetry(ctx, e)
		}
	}
	for _, e := range fails {
		r.cfg.Logger.Error("outbox relay: message failed after its last attempt", "id", e.Row.ID, "topic", e.Row.Topic, "attempts", e.Row.Attempts, "err", e.Err)
		if h.OnFailed != nil {
			h.OnFailed(ctx, e)
		}
	}
	return len(rows), nil
}

// hold is the ClaimRequest.Hold of the relay's claims: publishing takes at
// most PublishTimeout (then the batch is settled at once); twice that plus
// a second leaves room for a slow host or a GC pause.
func (r *Relay) hold() time.Duration { return 2*r.cfg.PublishTimeout + time.Second }

var errNotTried = errors.New("outbox: not published before the publish timeout")

// isOutage reports whether a round's failures say the broker is absent
// rather than anything about the messages: the broker took none of the
// (not Bad) rows, and every one failed with an outage-class error. Such a
// round reschedules its rows without failing them at MaxAttempts.
func isOutage(rows []Row, errs []error) bool {
	if errs == nil {
		return false
	}
	tried := false
	for i, row := range rows {
		if row.Bad != "" {
			continue
		}
		if !outageClass(errs[i]) {
			return false // published (nil), rejected, or unclassified
		}
		tried = true
	}
	return tried
}

// outageClass: the error says the broker could not be reached or did not
// answer in time, and not that it refused the message (broker.ErrRejected).
// A row not tried before the publish timeout is outage-class whatever the
// batch's error was (it was not published, nor refused on its own).
func outageClass(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, errNotTried):
		return true
	case errors.Is(err, broker.ErrRejected):
		return false
	}
	return errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) || errors.Is(err, context.DeadlineExceeded)
}

// publishGood publishes the rows that are not Bad (publish) and fails the
// Bad ones without trying. It returns nil when every row was published,
// else one error per row, and whether publishing (not a Bad row) failed.
func (r *Relay) publishGood(ctx context.Context, rows []Row) ([]error, bool) {
	if !slices.ContainsFunc(rows, func(row Row) bool { return row.Bad != "" }) {
		errs := r.publish(ctx, rows)
		return errs, errs != nil
	}
	errs := make([]error, len(rows))
	var good []Row
	var at []int // good[j] is rows[at[j]]
	for i, row := range rows {
		if row.Bad != "" {
			errs[i] = fmt.Errorf("outbox: stored row %d cannot be published: %s", row.Seq, row.Bad)
			continue
		}
		good = append(good, row)
		at = append(at, i)
	}
	if len(good) == 0 {
		return errs, false
	}
	perr := r.publish(ctx, good)
	for j, err := range perr {
		errs[at[j]] = err
	}
	return errs, perr != nil
}

// publish sends the rows as one batch; when that fails it sends them one
// by one within what is left of PublishTimeout, so one bad message does not
// cost the others an attempt. It returns nil when all were published, else
// one error per row (nil for the published ones).
func (r *Relay) publish(ctx context.Context, rows []Row) []error {
	msgs := make([]*broker.Message, len(rows))
	for i := range rows {
		m := &rows[i].Message
		msgs[i] = &broker.Message{ID: m.ID, Topic: m.Topic, Key: m.Key, Headers: m.Headers, Payload: m.Payload}
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	err := r.cfg.Publisher.Publish(pctx, msgs...)
	if err == nil {
		return nil
	}
	errs := make([]error, len(rows))
	if len(rows) == 1 {
		errs[0] = err
		return errs
	}
	for i, m := range msgs {
		if pctx.Err() != nil {
			errs[i] = fmt.Errorf("%w (batch: %w)", errNotTried, err)
			continue
		}
		errs[i] = r.cfg.Publisher.Publish(pctx, m)
	}
	return errs
}

func (r *Relay) purge(ctx context.Context) error {
	before := r.clockNow().Add(-r.cfg.Retention)
	for ctx.Err() == nil {
		n, err := r.cfg.Backend.PurgeSent(ctx, before, r.cfg.PurgeBatch)
		if err != nil {
			return err
		}
		if n < r.cfg.PurgeBatch {
			return nil
		}
	}
	return nil
}

func (r *Relay) stats(ctx context.Context) error {
	s, err := r.cfg.Backend.Stats(ctx)
	if err != nil {
		return err
	}
	r.cfg.Hooks.OnStats(ctx, s)
	return nil
}
