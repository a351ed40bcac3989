package memstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
)

// Config configures a memory store. The zero value is usable.
type Config struct {
	// Namespace of the handle returned by New ("" is the default namespace).
	Namespace string
	// MaxEntries bounds the live records of each namespace (default
	// 1,000,000). A full shard first drops its expired records; if none
	// expired, Claim of a new key fails with idem.ErrCapacity: evicting a
	// live record would let its duplicate through.
	MaxEntries int
	// Shards is the number of independently locked shards per namespace,
	// rounded up to a power of two (default 64).
	Shards int
	// SweepInterval is how often the background sweeper drops expired
	// records, one shard at a time (default 1s; negative disables it).
	SweepInterval time.Duration
	// Clock defaults to the system clock.
	Clock idem.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.MaxEntries == 0 {
		c.MaxEntries = 1_000_000
	}
	if c.Shards == 0 {
		c.Shards = 64
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Second
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if err := idem.ValidateNamespace(c.Namespace); err != nil {
		return err
	}
	if c.MaxEntries < 0 {
		return fmt.Errorf("%w: memstore: MaxEntries %d < 0", idem.ErrInvalidArgument, c.MaxEntries)
	}
	if c.Shards < 0 || c.Shards > 1<<16 {
		return fmt.Errorf("%w: memstore: Shards %d outside [1, 65536]", idem.ErrInvalidArgument, c.Shards)
	}
	return nil
}

// Store is an in-memory idem.Store. It implements idem.BatchClaimer,
// idem.Purger, idem.Lister, idem.Stater and idem.Pinger. Records do not
// survive the process: use it for tests, for a single process whose
// effects are also in memory, or as the reference behaviour.
type Store struct {
	b    *backend
	sp   *space
	root bool
}

type backend struct {
	cfg    Config
	seed   maphash.Seed
	mu     sync.Mutex
	spaces map[string]*space
	closed atomic.Bool
	stop   chan struct{}
	done   chan struct{}
}

type space struct {
	ns     string
	shards []shard
	mask   uint64
	b      *backend
}

type shard struct {
	mu   sync.Mutex
	m    map[string]*entry
	next uint64 // last token issued by this shard; a key always maps to one shard
	max  int
	// soonest is at most the earliest expiresAt of the shard's entries
	// (math.MaxInt64 when it has none): a purge before then has nothing
	// to drop and skips the scan of the whole map.
	soonest int64
	_       [56]byte // keep neighbouring shard locks off one cache line
}

// entry is one record. A fingerprint of up to 32 bytes (FingerprintOf's
// SHA-256) is kept inline and the result as a string: one allocation of
// 144 bytes per record, where a slice each made it two of 160.
type entry struct {
	state      idem.State
	fpn        uint8 // length of an inline fingerprint, in fpa
	token      uint64
	attempts   int
	fpa        [32]byte
	fpx        string // a fingerprint longer than fpa
	result     string
	lastErr    string
	ttl        int64
	leaseUntil int64
	expiresAt  int64
	created    int64
	updated    int64
}

// New returns a store with its own backend, serving cfg.Namespace.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	b := &backend{cfg: cfg, seed: maphash.MakeSeed(), spaces: map[string]*space{}, stop: make(chan struct{}), done: make(chan struct{})}
	s := &Store{b: b, sp: b.space(cfg.Namespace), root: true}
	if cfg.SweepInterval > 0 {
		go b.sweeper()
	} else {
		close(b.done)
	}
	return s, nil
}

// Namespace returns a handle on another namespace of the same backend.
// Closing it is a no-op; closing the store returned by New closes all.
func (s *Store) Namespace(ns string) (*Store, error) {
	if err := idem.ValidateNamespace(ns); err != nil {
		return nil, err
	}
	return &Store{b: s.b, sp: s.b.space(ns)}, nil
}

func (b *backend) space(ns string) *space {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sp, ok := b.spaces[ns]; ok {
		return sp
	}
	n := 1
	for n < b.cfg.Shards {
		n <<= 1
	}
	per := (b.cfg.MaxEntries + n - 1) / n
	sp := &space{ns: ns, shards: make([]shard, n), mask: uint64(n - 1), b: b}
	for i := range sp.shards {
		sp.shards[i].m = make(map[string]*entry)
		sp.shards[i].max = per
		sp.shards[i].soonest = math.MaxInt64
	}
	b.spaces[ns] = sp
	return sp
}

func (b *backend) allSpaces() []*space {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*space, 0, len(b.spaces))
	for _, sp := range b.spaces {
		out = append(out, sp)
	}
	return out
}

func (b *backend) sweeper() {
	defer close(b.done)
	t := time.NewTicker(b.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			now := b.cfg.Clock.Now().UnixNano()
			for _, sp := range b.allSpaces() {
				for i := range sp.shards {
					sh := &sp.shards[i]
					sh.mu.Lock()
					sh.purge(now, 0)
					sh.mu.Unlock()
				}
			}
		}
	}
}

// purge drops expired entries (at most limit if limit > 0). Caller holds mu.
func (sh *shard) purge(now int64, limit int) int {
	if now < sh.soonest {
		return 0
	}
	n := 0
	soonest := int64(math.MaxInt64)
	for k, e := range sh.m {
		if e.expiresAt > now {
			soonest = min(soonest, e.expiresAt)
			continue
		}
		delete(sh.m, k)
		n++
		if limit > 0 && n >= limit {
			return n // not every entry seen: soonest stays the bound it was
		}
	}
	sh.soonest = soonest
	return n
}

// expires notes that an entry of the shard now expires at at. Every write
// of an entry's expiresAt goes through it. Caller holds mu.
func (sh *shard) expires(e *entry, at int64) {
	e.expiresAt = at
	sh.soonest = min(sh.soonest, at)
}

func (s *Store) shard(key []byte) *shard {
	h := maphash.Bytes(s.b.seed, key)
	return &s.sp.shards[h&s.sp.mask]
}

func (s *Store) begin(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if s.b.closed.Load() {
		return 0, idem.ErrClosed
	}
	return s.b.cfg.Clock.Now().UnixNano(), nil
}

func unix(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// fpCopy returns a copy of the entry's fingerprint (nil: none).
func (e *entry) fpCopy() []byte {
	if e.fpn > 0 {
		return clone(e.fpa[:e.fpn])
	}
	return bytesOf(e.fpx)
}

// setFP stores a copy of fp as the entry's fingerprint.
func (e *entry) setFP(fp []byte) {
	if len(fp) <= len(e.fpa) {
		e.fpn = uint8(copy(e.fpa[:], fp))
		e.fpx = ""
		return
	}
	e.fpn, e.fpx = 0, string(fp)
}

func (e *entry) hasFP() bool { return e.fpn > 0 || e.fpx != "" }

// fpEqual reports whether fp is the entry's fingerprint.
func (e *entry) fpEqual(fp []byte) bool {
	if e.fpn > 0 {
		return string(e.fpa[:e.fpn]) == string(fp)
	}
	return e.fpx == string(fp)
}

// bytesOf is a copy of s, nil when s is empty (as clone gives).
func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

func (e *entry) record(key []byte) idem.Record {
	return idem.Record{
		Key: key, State: e.state, Token: e.token, Fingerprint: e.fpCopy(), Result: bytesOf(e.result),
		Attempts: e.attempts, LastError: e.lastErr, LeaseUntil: unix(e.leaseUntil),
		ExpiresAt: unix(e.expiresAt), CreatedAt: unix(e.created), UpdatedAt: unix(e.updated),
	}
}

// live returns the unexpired entry for key. Caller holds mu.
func (sh *shard) live(key []byte, now int64) *entry {
	e := sh.m[string(key)]
	if e == nil || e.expiresAt <= now {
		return nil
	}
	return e
}

// claim applies one claim under the shard lock.
func (sh *shard) claim(req *idem.ClaimRequest, now int64) (idem.Claim, error) {
	lease, ttl := int64(req.Lease), int64(req.TTL)
	e := sh.m[string(req.Key)]
	if e != nil && e.expiresAt > now {
		if e.hasFP() && len(req.Fingerprint) > 0 && !e.fpEqual(req.Fingerprint) {
			return idem.Claim{}, fmt.Errorf("%w: key %q", idem.ErrFingerprintMismatch, req.Key)
		}
		switch {
		case e.state == idem.StateCompleted:
			return idem.Claim{Outcome: idem.OutcomeCompleted, Record: e.record(req.Key)}, nil
		case e.state == idem.StateFailed:
			return idem.Claim{Outcome: idem.OutcomeFailed, Record: e.record(req.Key)}, nil
		case e.state == idem.StateInProgress && e.leaseUntil > now:
			return idem.Claim{Outcome: idem.OutcomeInProgress, Record: e.record(req.Key)}, nil
		}
		// Released, or in progress with an expired lease: take over.
		sh.next++
		e.token = sh.next
		e.state = idem.StateInProgress
		e.attempts++
		if !e.hasFP() && len(req.Fingerprint) > 0 {
			e.setFP(req.Fingerprint)
		}
		e.ttl = ttl
		e.leaseUntil = now + lease
		sh.expires(e, max(now+ttl, e.leaseUntil))
		e.updated = now
		return idem.Claim{Outcome: idem.OutcomeAcquired, Record: e.record(req.Key)}, nil
	}
	if e == nil && len(sh.m) >= sh.max {
		if sh.purge(now, 0) == 0 {
			return idem.Claim{}, fmt.Errorf("%w: memstore shard holds %d live records (MaxEntries)", idem.ErrCapacity, len(sh.m))
		}
	}
	sh.next++
	ne := e
	if ne == nil {
		ne = new(entry)
		sh.m[string(req.Key)] = ne
	}
	// A new entry, or the expired one reused with its map key.
	*ne = entry{state: idem.StateInProgress, token: sh.next, attempts: 1,
		ttl: ttl, leaseUntil: now + lease, created: now, updated: now}
	ne.setFP(req.Fingerprint)
	sh.expires(ne, max(now+ttl, ne.leaseUntil))
	// The record's key and fingerprint are the request's own slices, equal
	// to what the entry holds (its own copy): no second copy.
	fp := req.Fingerprint
	if len(fp) == 0 {
		fp = nil
	}
	return idem.Claim{Outcome: idem.OutcomeAcquired, Record: idem.Record{
		Key: req.Key, State: idem.StateInProgress, Token: ne.token, Fingerprint: fp, Attempts: 1,
		LeaseUntil: unix(ne.leaseUntil), ExpiresAt: unix(ne.expiresAt), CreatedAt: unix(now), UpdatedAt: unix(now),
	}}, nil
}

// Claim implements idem.Store.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	now, err := s.begin(ctx)
	if err != nil {
		return idem.Claim{}, err
	}
	sh := s.shard(req.Key)
	sh.mu.Lock()
	c, err := sh.claim(&req, now)
	sh.mu.Unlock()
	return c, err
}

// ClaimBatch implements idem.BatchClaimer. Entries are applied in order, each
// atomically; the batch as a whole is not one transaction (nor need it be:
// each key's outcome is what a sequential claim would give).
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	out := make([]idem.BatchResult, len(reqs))
	if err := s.ClaimBatchInto(ctx, reqs, out); err != nil {
		return nil, err
	}
	return out, nil
}

// ClaimBatchInto implements idem.BatchClaimerInto: ClaimBatch, the
// results written into out.
func (s *Store) ClaimBatchInto(ctx context.Context, reqs []idem.ClaimRequest, out []idem.BatchResult) error {
	if len(out) != len(reqs) {
		return fmt.Errorf("%w: memstore: %d results for %d claims", idem.ErrInvalidArgument, len(out), len(reqs))
	}
	now, err := s.begin(ctx)
	if err != nil {
		return err
	}
	for i := range reqs {
		if err := idem.ValidateClaim(reqs[i]); err != nil {
			out[i] = idem.BatchResult{Err: err}
			continue
		}
		sh := s.shard(reqs[i].Key)
		sh.mu.Lock()
		out[i].Claim, out[i].Err = sh.claim(&reqs[i], now)
		sh.mu.Unlock()
	}
	return nil
}

// settle runs fn on the live entry held by token.
func (s *Store) settle(ctx context.Context, key []byte, token uint64, fn func(sh *shard, e *entry, now int64) error) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	now, err := s.begin(ctx)
	if err != nil {
		return err
	}
	return s.settleAt(now, key, token, fn)
}

// settleEntry is settle of one entry of a batch call, at the batch's
// time now: the key and token are checked, as settle checks them.
func (s *Store) settleEntry(now int64, key []byte, token uint64, fn func(sh *shard, e *entry, now int64) error) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	return s.settleAt(now, key, token, fn)
}

// settleAt is settle at time now, the key and token checked.
func (s *Store) settleAt(now int64, key []byte, token uint64, fn func(sh *shard, e *entry, now int64) error) error {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.live(key, now)
	if e == nil {
		return fmt.Errorf("%w: key %q", idem.ErrNotFound, key)
	}
	if e.token != token {
		return fmt.Errorf("%w: key %q: token %d, current %d", idem.ErrFenced, key, token, e.token)
	}
	if err := fn(sh, e, now); err != nil {
		return fmt.Errorf("%w: key %q is %s", err, key, e.state)
	}
	return nil
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	if err := idem.ValidateResult(result); err != nil {
		return err
	}
	return s.settle(ctx, key, token, func(sh *shard, e *entry, now int64) error { return sh.complete(e, result, now) })
}

// complete applies a Complete to e. Caller holds sh.mu.
func (sh *shard) complete(e *entry, result []byte, now int64) error {
	switch e.state {
	case idem.StateCompleted:
		return nil
	case idem.StateInProgress:
		e.state, e.result, e.updated = idem.StateCompleted, string(result), now
		e.leaseUntil = 0
		sh.expires(e, now+e.ttl)
		return nil
	}
	return idem.ErrFenced
}

// CompleteBatch implements idem.BatchCompleter: each entry as Complete
// would apply it, all at one reading of the clock.
func (s *Store) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	now, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(cs))
	for i := range cs {
		c := &cs[i]
		if err := idem.ValidateResult(c.Result); err != nil {
			errs[i] = err
			continue
		}
		errs[i] = s.settleEntry(now, c.Key, c.Token, func(sh *shard, e *entry, now int64) error { return sh.complete(e, c.Result, now) })
	}
	return errs, nil
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.settle(ctx, key, token, func(_ *shard, e *entry, now int64) error {
		switch e.state {
		case idem.StateReleased:
			return nil
		case idem.StateInProgress:
			e.state, e.leaseUntil, e.updated = idem.StateReleased, 0, now
			if cause != "" {
				e.lastErr = cause
			}
			return nil
		}
		return idem.ErrFenced
	})
}

// Fail implements idem.Store.
func (s *Store) Fail(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.settle(ctx, key, token, func(sh *shard, e *entry, now int64) error {
		switch e.state {
		case idem.StateFailed:
			return nil
		case idem.StateInProgress:
			e.state, e.lastErr, e.updated = idem.StateFailed, cause, now
			e.leaseUntil = 0
			sh.expires(e, now+e.ttl)
			return nil
		}
		return idem.ErrFenced
	})
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	if err := idem.ValidateLease(lease); err != nil {
		return err
	}
	return s.settle(ctx, key, token, func(sh *shard, e *entry, now int64) error { return sh.extend(e, lease, now) })
}

// ExtendBatch implements idem.BatchExtender: each entry as Extend would
// apply it, all at one reading of the clock.
func (s *Store) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	now, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(es))
	for i := range es {
		x := &es[i]
		if err := idem.ValidateLease(x.Lease); err != nil {
			errs[i] = err
			continue
		}
		errs[i] = s.settleEntry(now, x.Key, x.Token, func(sh *shard, e *entry, now int64) error { return sh.extend(e, x.Lease, now) })
	}
	return errs, nil
}

// extend applies an Extend to e. Caller holds sh.mu.
func (sh *shard) extend(e *entry, lease time.Duration, now int64) error {
	if e.state != idem.StateInProgress {
		return idem.ErrFenced
	}
	e.leaseUntil, e.updated = now+int64(lease), now
	sh.expires(e, max(e.expiresAt, e.leaseUntil))
	return nil
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, key []byte) (idem.Record, error) {
	if err := idem.ValidateKey(key); err != nil {
		return idem.Record{}, err
	}
	now, err := s.begin(ctx)
	if err != nil {
		return idem.Record{}, err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.live(key, now)
	if e == nil {
		return idem.Record{}, fmt.Errorf("%w: key %q", idem.ErrNotFound, key)
	}
	return e.record(clone(key)), nil
}

// Delete implements idem.Store. The shard's token counter is kept, so a
// later claim of the key still gets a larger token.
func (s *Store) Delete(ctx context.Context, key []byte) error {
	if err := idem.ValidateKey(key); err != nil {
		return err
	}
	if _, err := s.begin(ctx); err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	delete(sh.m, string(key))
	sh.mu.Unlock()
	return nil
}

// Purge implements idem.Purger, one shard lock at a time.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	now, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range s.sp.shards {
		sh := &s.sp.shards[i]
		rem := 0
		if limit > 0 {
			rem = limit - n
			if rem <= 0 {
				break
			}
		}
		sh.mu.Lock()
		n += sh.purge(now, rem)
		sh.mu.Unlock()
	}
	return n, nil
}

// ListInProgress implements idem.Lister. The cursor is the index of the next
// shard to read; each page holds whole shards (so it may exceed limit when
// one shard alone holds more).
func (s *Store) ListInProgress(ctx context.Context, cursor string, limit int) ([]idem.Record, string, error) {
	now, err := s.begin(ctx)
	if err != nil {
		return nil, "", err
	}
	// The cursor is "shard" or "shard:hex(last key listed)": a page stops at
	// limit records, possibly inside a shard, and the next page resumes
	// after that key.
	start, after, err := parseListCursor(cursor, len(s.sp.shards))
	if err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		limit = 100
	}
	var out []idem.Record
	for i := start; i < len(s.sp.shards); i++ {
		sh := &s.sp.shards[i]
		var recs []idem.Record
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.state == idem.StateInProgress && e.expiresAt > now && (after == nil || k > string(after)) {
				recs = append(recs, e.record([]byte(k)))
			}
		}
		sh.mu.Unlock()
		after = nil
		sort.Slice(recs, func(a, b int) bool { return string(recs[a].Key) < string(recs[b].Key) })
		if room := limit - len(out); len(recs) > room {
			out = append(out, recs[:room]...)
			return out, strconv.Itoa(i) + ":" + hex.EncodeToString(out[len(out)-1].Key), nil
		}
		out = append(out, recs...)
		if len(out) == limit && i+1 < len(s.sp.shards) {
			return out, strconv.Itoa(i + 1), nil
		}
	}
	return out, "", nil
}

func parseListCursor(cursor string, shards int) (start int, after []byte, err error) {
	if cursor == "" {
		return 0, nil, nil
	}
	num, key, hasKey := strings.Cut(cursor, ":")
	start, err = strconv.Atoi(num)
	if err == nil && hasKey {
		after, err = hex.DecodeString(key)
	}
	if err != nil || start < 0 || start > shards || (hasKey && len(after) == 0) {
		return 0, nil, fmt.Errorf("%w: memstore: bad cursor %q", idem.ErrInvalidArgument, cursor)
	}
	return start, after, nil
}

// Stats implements idem.Stater.
func (s *Store) Stats(ctx context.Context) (idem.Stats, error) {
	now, err := s.begin(ctx)
	if err != nil {
		return idem.Stats{}, err
	}
	var st idem.Stats
	for i := range s.sp.shards {
		sh := &s.sp.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if e.expiresAt <= now {
				continue
			}
			switch e.state {
			case idem.StateInProgress:
				st.InProgress++
			case idem.StateCompleted:
				st.Completed++
			case idem.StateFailed:
				st.Failed++
			case idem.StateReleased:
				st.Released++
			}
		}
		sh.mu.Unlock()
	}
	return st, nil
}

// Ping implements idem.Pinger.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.begin(ctx)
	return err
}

// Close stops the sweeper; later calls fail with idem.ErrClosed. Closing a
// handle from Namespace is a no-op.
func (s *Store) Close() error {
	if !s.root || !s.b.closed.CompareAndSwap(false, true) {
		return nil
	}
	select {
	case <-s.b.stop:
	default:
		close(s.b.stop)
	}
	<-s.b.done
	return nil
}

// ClassifyError implements idem.ErrorClassifier. The memory store has no
// driver: its own errors are idem's already (ErrCapacity, ErrClosed...) and
// come back unchanged, as does anything idem.ClassifyError leaves alone.
func (s *Store) ClassifyError(err error) error { return idem.ClassifyError(err) }

var (
	_ idem.ErrorClassifier  = (*Store)(nil)
	_ idem.Store            = (*Store)(nil)
	_ idem.BatchClaimer     = (*Store)(nil)
	_ idem.BatchClaimerInto = (*Store)(nil)
	_ idem.BatchCompleter   = (*Store)(nil)
	_ idem.BatchExtender    = (*Store)(nil)
	_ idem.Purger           = (*Store)(nil)
	_ idem.Lister           = (*Store)(nil)
	_ idem.Stater           = (*Store)(nil)
	_ idem.Pinger           = (*Store)(nil)
)
