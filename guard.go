package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Func is a handler guarded by a Guard. Its effect should be done when it
// returns nil; the []byte it returns is stored and replayed to duplicates.
// ctx is cancelled with cause ErrLeaseLost if the claim is lost while it runs.
type Func func(ctx context.Context) ([]byte, error)

// Result is what Do and Acquire report.
type Result struct {
	Value      []byte // the handler's result, or the stored one on a replay
	Replayed   bool   // true: the key was already completed; the handler did not run
	Token      uint64 // fencing token of the claim (of the completing claim on a replay)
	Attempts   int    // claims of this key so far, this one included
	FailedOpen bool   // true: the store failed and fail-open let the handler run unrecorded
}

// Guard runs handlers so that each key's effect happens once. It is safe for
// concurrent use.
type Guard struct {
	store   Store
	batch   BatchClaimer
	into    BatchClaimerInto // set when batch is one too
	bc      BatchCompleter   // the store's, nil when it has none
	cfg     guardConfig
	hooks   hookSet
	log     *slog.Logger
	beats   *beater // nil when the heartbeat is off
	bg      *bgCompleter
	holding *holding // the keys held by this guard's claims
	closed  atomic.Bool
}

// errGuardClosed is what a claim gets after Close.
var errGuardClosed = fmt.Errorf("%w: guard closed: no new claims", ErrClosed)

// NewGuard returns a guard over store. It fails on an invalid option.
func NewGuard(store Store, opts ...Option) (*Guard, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: guard: nil store", ErrInvalidArgument)
	}
	cfg := guardConfig{lease: DefaultLease, ttl: DefaultTTL, completeRetries: DefaultCompleteRetries}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.heartbeat == 0 {
		cfg.heartbeat = cfg.lease / 3
	}
	if cfg.background == 0 {
		cfg.background = DefaultBackgroundRetry
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.clock == nil {
		cfg.clock = SystemClock{}
	}
	g := &Guard{store: store, cfg: cfg, hooks: newHookSet(cfg.hooks, cfg.logger), log: cfg.logger}
	g.batch, _ = store.(BatchClaimer)
	g.bc, _ = store.(BatchCompleter)
	if g.batch != nil {
		g.into, _ = store.(BatchClaimerInto)
	}
	g.bg = &bgCompleter{g: g, budget: cfg.background}
	g.holding = newHolding()
	if cfg.heartbeat > 0 {
		g.beats = newBeater(g, cfg.heartbeat)
	}
	if cfg.redelivery > 0 {
		_ = g.CheckRedeliveryWindow(cfg.redelivery)
	}
	return g, nil
}

// Close stops the guard's goroutines (they also stop by themselves when
// idle). From then on Do, Acquire and AcquireBatch take no new claim: they
// return an error matching ErrClosed. Claims taken before may still be
// settled (Complete, Release: one foreground try and its retries), but
// are no longer extended. Completions still being retried in the
// background get one last try and are then abandoned (reported to
// Hooks.OnUnrecorded); Close waits for that a bounded time. It does not
// close the store. Calling it again does nothing.
func (g *Guard) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	g.bg.close()
	if g.beats != nil {
		g.beats.close()
	}
	return nil
}

// Store returns the guard's store.
func (g *Guard) Store() Store { return g.store }

// CheckRedeliveryWindow returns an error, and logs a warning, when the
// guard's TTL is shorter than window: a message redelivered after its record
// expired would run again (invariant 6).
func (g *Guard) CheckRedeliveryWindow(window time.Duration) error {
	if g.cfg.ttl >= window {
		return nil
	}
	g.log.Warn("idem: record TTL is shorter than the broker's redelivery window; late redeliveries will run again",
		"ttl", g.cfg.ttl, "redelivery_window", window)
	return fmt.Errorf("%w: ttl %s is shorter than the redelivery window %s", ErrInvalidArgument, g.cfg.ttl, window)
}

// Do runs fn at most once to completion per key:
//
//   - first time (or after a release or an expired lease): claims the key,
//     runs fn while a heartbeat extends the lease, records fn's result;
//   - already completed: returns the stored result with Replayed set, fn
//     does not run;
//   - held by a live lease elsewhere, or claimed or held by this guard and
//     not yet settled (whatever its lease says: see docs/guard.md):
//     *InProgressError (ErrInProgress): retry later, do not ack;
//   - terminally failed: *FailedError (ErrFailed): dead-letter;
//   - fn fails: the key is released (or marked failed once attempts are
//     exhausted, or at once for a Permanent error) and the error is returned
//     as a *HandlerError (joined with a *FailedError if it was marked failed);
//     a panic in fn is recovered (its stack logged) and is such an error,
//     matching ErrPanicked;
//   - the store fails: its error (fail closed), unless WithFailOpen.
func (g *Guard) Do(ctx context.Context, key []byte, fn Func, opts ...CallOption) (Result, error) {
	h, res, err := g.Acquire(ctx, key, opts...)
	if err != nil || h == nil {
		return res, err
	}
	val, ferr := h.run(ctx, fn)
	if ferr != nil {
		if rerr := h.Release(ctx, ferr); rerr != nil {
			return res, errors.Join(&HandlerError{Err: ferr}, rerr)
		}
		return res, &HandlerError{Err: ferr}
	}
	if err := h.Complete(ctx, val); err != nil {
		return res, err
	}
	res.Value = val
	return res, nil
}

// Acquire claims key without running anything, for callers that drive the
// effect themselves (batch consumers). On OutcomeAcquired it returns a Held
// whose lease is kept alive by a heartbeat until Complete or Release; on a
// replay it returns a nil Held and the stored result. Errors are as for Do.
func (g *Guard) Acquire(ctx context.Context, key []byte, opts ...CallOption) (*Held, Result, error) {
	if g.closed.Load() {
		return nil, Result{}, errGuardClosed
	}
	req := ClaimRequest{Key: key, Lease: g.cfg.lease, TTL: g.cfg.ttl}
	if len(opts) > 0 { // cc escapes through the option funcs: pay only when used
		cc := new(callConfig)
		for _, o := range opts {
			o(cc)
		}
		req.Fingerprint = cc.fingerprint
		if cc.lease != 0 {
			req.Lease = cc.lease
		}
		if cc.ttl != 0 {
			req.TTL = cc.ttl
		}
	}
	start := g.cfg.clock.Now() // the lease runs from no earlier than this
	e, cur := g.holding.claim(key, req.Fingerprint)
	if e == nil {
		// Claimed or held by this guard: in progress, whatever its lease
		// says (see holding).
		a := g.heldHere(ctx, req, cur, start)
		return a.Held, a.Result, a.Err
	}
	c, err := g.store.Claim(ctx, req)
	a := g.claimed(ctx, req, c, err, start, e, true)
	return a.Held, a.Result, a.Err
}

// BatchItem is one key of AcquireBatch.
type BatchItem struct {
	Key         []byte
	Fingerprint []byte
}

// Acquisition is one result of AcquireBatch: as Acquire's three results.
type Acquisition struct {
	Held   *Held
	Result Result
	Err    error
}

// AcquireBatch claims many keys, in one store round-trip when the store is a
// BatchClaimer (one by one otherwise). Results are in item order. The
// returned error is for the batch as a whole, and then no Acquisition is
// returned (nothing may be acked): the store failed (fail closed), or it
// answered with a number of results other than the number of items
// (ErrUnknownOutcome: keys it did claim are released by their leases
// lapsing). Per-key outcomes are in each Acquisition.
func (g *Guard) AcquireBatch(ctx context.Context, items []BatchItem) ([]Acquisition, error) {
	if g.closed.Load() {
		return nil, errGuardClosed
	}
	out := make([]Acquisition, len(items))
	if err := g.AcquireBatchInto(ctx, items, out); err != nil {
		return nil, err
	}
	return out, nil
}

// AcquireBatchInto is AcquireBatch writing its results into out, which
// the caller provides with len(out) == len(items) (ErrInvalidArgument
// otherwise), for a caller that claims batch after batch and reuses one
// slice (consumer does). Every entry of out is written; after an error
// out holds nothing of use and, as for AcquireBatch, nothing may be
// acked.
func (g *Guard) AcquireBatchInto(ctx context.Context, items []BatchItem, out []Acquisition) error {
	if len(out) != len(items) {
		return fmt.Errorf("%w: AcquireBatchInto: %d results for %d items", ErrInvalidArgument, len(out), len(items))
	}
	if g.closed.Load() {
		return errGuardClosed
	}
	if g.batch == nil {
		for i, it := range items {
			h, r, err := g.Acquire(ctx, it.Key, WithFingerprint(it.Fingerprint))
			out[i] = Acquisition{Held: h, Result: r, Err: err}
		}
		return nil
	}
	// Keys this guard claims or holds already (a key twice in items: its
	// first entry) are in progress (see holding); the rest go to the
	// store.
	sc := getBatchScratch()
	defer sc.put()
	start := g.cfg.clock.Now()
	for i, it := range items {
		e, cur := g.holding.claim(it.Key, it.Fingerprint)
		if e == nil {
			out[i] = g.heldHere(ctx, g.batchRequest(it), cur, start)
			continue
		}
		sc.reqs, sc.idx, sc.es = append(sc.reqs, g.batchRequest(it)), append(sc.idx, i), append(sc.es, e)
	}
	if len(sc.reqs) == 0 {
		return nil
	}
	return g.claimBatch(ctx, sc, out)
}

// batchScratch is AcquireBatch's working lists, reused from batch to
// batch (three lists of a thousand entries made per batch were a tenth
// of a batch consumer's allocation): the claims sent to the store, the
// index in the batch of each, and each one's entry in the holding set.
type batchScratch struct {
	reqs []ClaimRequest
	idx  []int
	es   []*holdEntry
	res  []BatchResult // the store's answers, when it is a BatchClaimerInto
}

var batchScratchPool = sync.Pool{New: func() any { return new(batchScratch) }}

func getBatchScratch() *batchScratch { return batchScratchPool.Get().(*batchScratch) }

// put returns sc to the pool, keeping no key or claim alive.
func (sc *batchScratch) put() {
	clear(sc.reqs)
	clear(sc.es)
	clear(sc.res)
	sc.reqs, sc.idx, sc.es, sc.res = sc.reqs[:0], sc.idx[:0], sc.es[:0], sc.res[:0]
	batchScratchPool.Put(sc)
}

// batchRequest is the claim of a batch item, with the guard's lease and TTL.
func (g *Guard) batchRequest(it BatchItem) ClaimRequest {
	return ClaimRequest{Key: it.Key, Fingerprint: it.Fingerprint, Lease: g.cfg.lease, TTL: g.cfg.ttl}
}

// claimBatch is AcquireBatch's store round-trip for the claims in sc; the
// answer to sc.reqs[j] goes to out[sc.idx[j]].
func (g *Guard) claimBatch(ctx context.Context, sc *batchScratch, out []Acquisition) error {
	reqs, es := sc.reqs, sc.es
	start := g.cfg.clock.Now()
	var res []BatchResult
	var err error
	if g.into != nil {
		sc.res = slices.Grow(sc.res[:0], len(reqs))[:len(reqs)]
		res, err = sc.res, g.into.ClaimBatchInto(ctx, reqs, sc.res)
	} else {
		res, err = g.batch.ClaimBatch(ctx, reqs)
	}
	if err == nil && len(res) != len(reqs) {
		// The store said something inconsistent: which answer belongs to
		// which key is unknown, so none is trusted.
		err = fmt.Errorf("%w: store answered %d results for %d claims", ErrUnknownOutcome, len(res), len(reqs))
	}
	if err != nil {
		for j := range reqs {
			g.holding.drop(es[j])
			g.onClaim(ctx, reqs[j], Claim{}, err, start)
		}
		if g.cfg.failOpen && failOpenable(ctx, err) {
			for j, i := range sc.idx {
				out[i] = g.openPass(ctx, reqs[j].Key, err)
			}
			return nil
		}
		return fmt.Errorf("idem: batch claim of %d keys: %w", len(reqs), err)
	}
	for j, i := range sc.idx {
		out[i] = g.claimed(ctx, reqs[j], res[j].Claim, res[j].Err, start, es[j], false)
	}
	return nil
}

// failOpenable: fail-open passes only when the store could not be reached
// and applied nothing. An unknown outcome (the claim may exist), a full
// store, a corrupt record or any unclassified error fails closed.
func failOpenable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrUnknownOutcome)
}

func (g *Guard) onClaim(ctx context.Context, req ClaimRequest, c Claim, err error, start time.Time) {
	if len(g.hooks.claim) == 0 {
		return
	}
	e := ClaimEvent{Key: req.Key, Outcome: c.Outcome, Attempts: c.Record.Attempts, Err: err, Duration: g.cfg.clock.Now().Sub(start)}
	for _, h := range g.hooks.claim {
		h(ctx, e)
	}
}

func (g *Guard) openPass(ctx context.Context, key []byte, err error) Acquisition {
	g.log.Warn("idem: store failed; fail-open lets the handler run without a record", "key", string(truncKey(key)), "err", err)
	for _, h := range g.hooks.failOpen {
		h(ctx, key, err)
	}
	return Acquisition{Held: &Held{g: g, key: key, open: true}, Result: Result{FailedOpen: true}}
}

// claimed turns a store claim into an Acquisition; e is the claim's entry
// in the holding set, which an acquired claim takes over (heartbeat on)
// and which is dropped otherwise. alone: a claim of its own (Acquire),
// whose Held comes with its first settle round's context (heldAlone); a
// batch's claims settle together and make one per round.
func (g *Guard) claimed(ctx context.Context, req ClaimRequest, c Claim, err error, start time.Time, e *holdEntry, alone bool) Acquisition {
	kept := false
	defer func() {
		if !kept {
			g.holding.drop(e)
		}
	}()
	g.onClaim(ctx, req, c, err, start)
	if err != nil {
		if g.cfg.failOpen && failOpenable(ctx, err) {
			return g.openPass(ctx, req.Key, err)
		}
		if errors.Is(err, ErrFingerprintMismatch) || errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidArgument) {
			return Acquisition{Err: err}
		}
		return Acquisition{Err: fmt.Errorf("idem: claim %q: %w", truncKey(req.Key), err)}
	}
	rec := &c.Record
	switch c.Outcome {
	case OutcomeCompleted:
		return Acquisition{Result: Result{Value: rec.Result, Replayed: true, Token: rec.Token, Attempts: rec.Attempts}}
	case OutcomeInProgress:
		return Acquisition{Err: &InProgressError{Key: req.Key, LeaseUntil: rec.LeaseUntil, Lease: req.Lease}}
	case OutcomeFailed:
		return Acquisition{Err: &FailedError{Key: req.Key, Cause: rec.LastError, Attempts: rec.Attempts}}
	case OutcomeAcquired:
	default:
		return Acquisition{Err: fmt.Errorf("%w: store returned outcome %d", ErrUnknownOutcome, c.Outcome)}
	}
	var h *Held
	if alone {
		ha := new(heldAlone)
		h = &ha.Held
		h.rc = &ha.rctx
	} else {
		h = new(Held)
	}
	h.g, h.key, h.token, h.attempts, h.lease = g, req.Key, rec.Token, rec.Attempts, req.Lease
	h.leaseUntil, h.interval = start.Add(req.Lease), g.beatInterval(req.Lease)
	if g.hooks.timed() {
		h.start = start
	}
	res := Result{Token: rec.Token, Attempts: rec.Attempts}
	if g.cfg.maxAttempts > 0 && rec.Attempts > g.cfg.maxAttempts {
		// Earlier holders died without settling (a crash loop on a poison
		// message): stop here instead of running it again.
		cause := TruncateCause(fmt.Sprintf("attempts exhausted: %d claims, last error: %s", rec.Attempts-1, rec.LastError))
		op := h.newOp(SettleFail, nil, cause)
		g.settleNow(ctx, []*settleOp{op}, nil)
		if op.done {
			g.settled(ctx, op)
		}
		if op.err != nil {
			// Not recorded: the next claim, after the lease, finds it again.
			return Acquisition{Err: fmt.Errorf("idem: mark %q failed: %w", truncKey(req.Key), op.err)}
		}
		return Acquisition{Err: &FailedError{Key: req.Key, Cause: cause, Attempts: rec.Attempts}}
	}
	if g.beats != nil {
		// Before the heartbeat starts: a claim lost at once leaves the set.
		g.holding.acquired(e, h)
		kept = true
	} // with the heartbeat off, in the set from its settle on (settleNow)
	h.startHeartbeat()
	return Acquisition{Held: h, Result: res}
}

// Held is a claim the caller holds. Settle it exactly once with Complete or
// Release; until then a heartbeat extends its lease.
type Held struct {
	g        *Guard
	key      []byte
	token    uint64
	attempts int
	lease    time.Duration
	interval time.Duration // heartbeat interval for this claim's lease
	start    time.Time

	// heartbeat list links, guarded by shard.mu; shard is set once by add
	prev, next *Held
	shard      *beatShard
	lastBeat   time.Time // guard clock: sent time of the claim or of the last successful extend

	// The flags sit together: one word, not one each (the Held of every
	// claim is allocated; 8 bytes more would take it past its size class).
	open     bool // fail-open pass: nothing in the store
	linked   bool // guarded by shard.mu
	beating  bool // guarded by shard.mu
	settling bool // guarded by mu: a settle is being tried: the settle, not a beat, reports a loss
	settled  bool // guarded by mu
	lost     bool // guarded by mu

	hold *holdEntry // its entry in the guard's holding set (see holding), guarded by the set's lock

	mu         sync.Mutex
	leaseUntil time.Time // guard clock: the lease runs at least until then
	lostErr    error
	done       chan struct{} // made on demand by Done
	watch      lostReg       // AfterLost registrations, guarded by mu
	cctx       context.Context
	cancel     context.CancelCauseFunc
	hparent    context.Context // the parent of the handler's context (heldCtx), set by run
	rc         *deadlineCtx    // the first settle round's context, when made with the Held (heldAlone)
	op         settleOp
}

// heldAlone is the Held of a claim of its own (Acquire, Do) with the
// context of its first settle round, which Complete would otherwise
// allocate: one object. A batch's claims are plain Helds (80 bytes
// fewer each): their settle makes one context per round for all.
type heldAlone struct {
	Held
	rctx deadlineCtx
}

// Key returns the held key.
func (h *Held) Key() []byte { return h.key }

// Token returns the claim's fencing token. Pass it to the effect where the
// effect's store can check it (a conditional write), so a worker whose lease
// was taken over cannot apply a stale effect.
func (h *Held) Token() uint64 { return h.token }

// Attempts returns how many claims of the key there have been, this one
// included.
func (h *Held) Attempts() int { return h.attempts }

// Done returns a channel closed when the claim is lost (taken over after a
// lease expiry, or deleted) while held.
func (h *Held) Done() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done == nil {
		h.done = make(chan struct{})
		if h.lost {
			close(h.done)
		}
	}
	return h.done
}

func (h *Held) startHeartbeat() {
	if h.g.beats != nil {
		h.g.beats.add(h)
	}
}

func (h *Held) markLost(ctx context.Context, err error) {
	h.mu.Lock()
	if h.lost {
		h.mu.Unlock()
		return
	}
	h.lost = true
	h.lostErr = fmt.Errorf("%w: %w", ErrLeaseLost, err)
	if h.done != nil {
		close(h.done)
	}
	cancel := h.cancel
	watch := h.watch
	h.watch = lostReg{}
	h.mu.Unlock()
	watch.fire()
	h.g.holding.remove(h) // someone else holds the key now
	h.g.log.Warn("idem: claim lost while held (lease expired and taken over, or deleted)", "key", string(truncKey(h.key)), "token", h.token, "err", err)
	for _, hk := range h.g.hooks.lost {
		hk(ctx, h.key, h.token, err)
	}
	if cancel != nil {
		cancel(h.lostErr)
	}
}

// leaseEnd is when the lease may lapse unless extended again: the time the
// claim or the last successful extend was sent, plus the lease.
func (h *Held) leaseEnd() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leaseUntil
}

// extended records a successful extend sent at sent.
func (h *Held) extended(sent time.Time) {
	h.mu.Lock()
	if u := sent.Add(h.lease); u.After(h.leaseUntil) {
		h.leaseUntil = u
	}
	h.mu.Unlock()
}

func (h *Held) beginSettle() {
	h.mu.Lock()
	h.settling = true
	h.mu.Unlock()
}

// stopHeartbeat ends the claim here: settled (recorded, refused for good,
// or given up on), it is no longer extended, and no longer keeps the key
// in progress for this guard's other claims.
func (h *Held) stopHeartbeat() {
	h.mu.Lock()
	h.settled = true
	h.mu.Unlock()
	if h.g.beats != nil {
		h.g.beats.remove(h)
	}
	h.g.holding.remove(h)
}

type heldKey struct{}

// heldCtx is the handler's context: the Held itself seen as a context
// (no allocation, no field of its own: its parent is Held.hparent). The
// cancellable context behind it is made only when the handler asks for
// Done, Err or a cause: most handlers hand ctx to a driver that does, but
// a pure in-memory effect pays nothing.
type heldCtx Held

func (c *heldCtx) held() *Held                 { return (*Held)(c) }
func (c *heldCtx) Deadline() (time.Time, bool) { return c.hparent.Deadline() }
func (c *heldCtx) Done() <-chan struct{}       { return c.held().cancelCtx(c.hparent).Done() }
func (c *heldCtx) Err() error                  { return c.held().cancelCtx(c.hparent).Err() }

func (c *heldCtx) Value(k any) any {
	if k == (heldKey{}) {
		return c.held()
	}
	// context.Cause finds the cancel cause through Value.
	return c.held().cancelCtx(c.hparent).Value(k)
}

// cancelCtx returns the context that is cancelled when the claim is lost,
// making it on first use.
func (h *Held) cancelCtx(parent context.Context) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cctx == nil {
		h.cctx, h.cancel = context.WithCancelCause(parent)
		if h.lost {
			h.cancel(h.lostErr)
		}
	}
	return h.cctx
}

// TokenFromContext returns the fencing token of the claim whose handler is
// running with ctx: inside Do, or under a context from ContextWithHeld.
func TokenFromContext(ctx context.Context) (uint64, bool) {
	h, ok := ctx.Value(heldKey{}).(*Held)
	if !ok || h.open {
		return 0, false
	}
	return h.token, true
}

// ContextWithHeld returns parent carrying h, so that TokenFromContext
// inside it reports h's token, as it does inside Do's handler. It is for
// code that runs an effect under a claim taken with Acquire (consumer.Steps
// runs each step with it) and wants the effect to read its fencing token.
// It adds no cancellation: watch h.Done() for a lost claim. A nil h, or a
// fail-open pass (no claim), gives no token.
func ContextWithHeld(parent context.Context, h *Held) context.Context {
	if h == nil {
		return parent
	}
	return context.WithValue(parent, heldKey{}, h)
}

func (h *Held) run(ctx context.Context, fn Func) (val []byte, err error) {
	defer func() {
		h.mu.Lock()
		cancel := h.cancel
		h.mu.Unlock()
		if cancel != nil {
			cancel(nil)
		}
		if r := recover(); r != nil {
			// An error of this call, not a crash of the process: Do
			// releases the key as for any handler error.
			h.g.log.Error("idem: handler panicked", "key", string(truncKey(h.key)), "token", h.token,
				"panic", r, "stack", string(debug.Stack()))
			val, err = nil, fmt.Errorf("%w: %v", ErrPanicked, r)
		}
	}()
	h.hparent = ctx
	return fn((*heldCtx)(h))
}

// Complete records the effect as done with result. The heartbeat keeps the
// lease until the store has recorded it. A failed call is retried with
// backoff, reading the record first when the outcome is unknown (a
// Complete that timed out may have been applied), for as long as the lease
// allows: at most one lease from the first try and never past the end of
// the lease as last extended (a cancelled ctx does not stop it: recording
// a done effect matters more than a shutdown). Then:
//
//   - an error matching ErrFenced or ErrNotFound: the claim was lost;
//   - ErrUnrecorded: the effect happened but is not recorded yet. The guard
//     keeps trying in the background (WithBackgroundRetry) with the lease
//     kept alive, and reports the outcome to Hooks.OnUnrecorded. Ack the
//     message: the effect is done.
//   - a result longer than MaxResultLen: the effect ran but its result
//     cannot be stored, so the key is marked failed with the reason instead
//     (duplicates get ErrFailed and never re-run it) and the error matches
//     ErrResultTooLarge: ack, do not retry.
func (h *Held) Complete(ctx context.Context, result []byte) error {
	if h.open {
		return nil
	}
	op := h.completeOp(result)
	h.g.settleNow(ctx, []*settleOp{op}, nil)
	return h.g.finish(ctx, op, true)
}

// Release gives the key back after a failed effect so it may be claimed
// again, recording cause. If cause is Permanent, or the key has used up
// WithMaxAttempts, the key is marked failed instead and Release returns a
// *FailedError (ErrFailed): dead-letter the message. It is retried as
// Complete is; a release that cannot be recorded lets the lease lapse
// (which frees the key too) and returns the store's error. A Fail that
// cannot be recorded is retried in the background like a completion.
func (h *Held) Release(ctx context.Context, cause error) error {
	if h.open {
		return nil
	}
	msg := ""
	if cause != nil {
		msg = TruncateCause(cause.Error())
	}
	op := h.newOp(SettleRelease, nil, msg)
	if IsPermanent(cause) || (h.g.cfg.maxAttempts > 0 && h.attempts >= h.g.cfg.maxAttempts) {
		op.action = SettleFail
	}
	h.g.settleNow(ctx, []*settleOp{op}, nil)
	if err := h.g.finish(ctx, op, true); err != nil {
		return err
	}
	if op.action == SettleFail {
		return &FailedError{Key: h.key, Cause: msg, Attempts: h.attempts}
	}
	return nil
}

func (h *Held) onSettle(ctx context.Context, a SettleAction, err error, start time.Time) {
	if len(h.g.hooks.settle) == 0 {
		return
	}
	now := h.g.cfg.clock.Now()
	e := SettleEvent{Key: h.key, Token: h.token, Action: a, Err: err, Duration: now.Sub(start)}
	if !h.start.IsZero() {
		e.Held = now.Sub(h.start)
	}
	for _, hk := range h.g.hooks.settle {
		hk(ctx, e)
	}
}

// CompleteBatch completes many held claims, in one store round-trip when
// the store is a BatchCompleter (one by one otherwise). results[i] is the
// result of hs[i]; results may be nil (no results). errs[i] is what
// hs[i].Complete would return. Every claim keeps its heartbeat until its
// completion is recorded; a failed call is retried as a batch, with
// backoff, for as long as the leases allow, then each entry not recorded
// gets ErrUnrecorded and goes on in the background, as in Complete.
func (g *Guard) CompleteBatch(ctx context.Context, hs []*Held, results [][]byte) []error {
	errs := make([]error, len(hs))
	if results != nil && len(results) != len(hs) {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: CompleteBatch: %d results for %d claims", ErrInvalidArgument, len(results), len(hs))
		}
		return errs
	}
	sc := getSettleScratch()
	ops, idx := slices.Grow(sc.ops[:0], len(hs)), slices.Grow(sc.idx[:0], len(hs))
	defer func() {
		sc.ops, sc.idx = ops, idx
		sc.put()
	}()
	for i, h := range hs {
		if h.open {
			continue
		}
		var res []byte
		if results != nil {
			res = results[i]
		}
		ops = append(ops, h.completeOp(res))
		idx = append(idx, i)
	}
	if len(ops) == 0 {
		return errs
	}
	g.settleNow(ctx, ops, g.bc)
	for j, op := range ops {
		errs[idx[j]] = g.finish(ctx, op, true)
	}
	return errs
}

// FingerprintOf returns a SHA-256 fingerprint of the given parts (each
// length-prefixed, so ("ab","c") and ("a","bc") differ). Use it with
// WithFingerprint on the message payload or the fields that define it.
// docs/fingerprint.md gives the format for producers in other languages,
// with test vectors.
func FingerprintOf(parts ...[]byte) []byte {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(nil)
}
