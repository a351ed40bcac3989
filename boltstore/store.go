package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem"
)

// Store is an idem.Store kept in one bbolt file. A Store value serves one
// namespace; Namespace returns handles on others in the same file, sharing
// its commit loop. It implements idem.BatchClaimer, idem.BatchCompleter,
// idem.BatchExtender, idem.Purger, idem.Lister, idem.Stater and
// idem.Pinger.
type Store struct {
	b    *backend
	ns   string
	name []byte // top-level bucket name: "ns/" + ns
	root bool
}

// Open opens (or creates) the file at cfg.Path and returns the handle of
// cfg.Namespace. The file is locked: a second process opening it gets an
// error wrapping ErrInUse and idem.ErrUnavailable after cfg.LockTimeout. A
// damaged file gets an error wrapping ErrCorrupt that names the file and the
// problem.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	db, err := openFile(&cfg)
	if err != nil {
		return nil, err
	}
	b := &backend{
		bolt: db, cfg: cfg, queue: make(chan *op, 4*cfg.MaxBatch),
		stop: make(chan struct{}), loop: make(chan struct{}), sweep: make(chan struct{}),
		spaces: map[string]bool{},
	}
	// What this process serves from now on must be on disk: a previous
	// process may have died between bbolt's meta write and its fdatasync,
	// leaving a commit in the page cache only.
	if err := db.Sync(); err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: open %s: %w: fdatasync: %w", cfg.Path, idem.ErrUnavailable, err)
	}
	tx, err := db.Begin(false)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: open %s: %w: %w", cfg.Path, idem.ErrUnavailable, err)
	}
	b.durable.Store(uint64(tx.ID()))
	_ = tx.Rollback()
	first := make(chan struct{})
	b.committed.Store(&first)
	go b.run()
	if cfg.SweepInterval > 0 {
		go b.sweeper()
	} else {
		close(b.sweep)
	}
	s, err := b.handle(cfg.Namespace)
	if err != nil {
		b.close()
		return nil, err
	}
	s.root = true
	return s, nil
}

func (b *backend) handle(ns string) (*Store, error) {
	if err := idem.ValidateNamespace(ns); err != nil {
		return nil, err
	}
	if err := b.ensureNamespace(ns); err != nil {
		return nil, err
	}
	return &Store{b: b, ns: ns, name: []byte(nsPrefix + ns)}, nil
}

// Namespace returns a handle on namespace ns of the same file, creating its
// buckets if needed. Closing it is a no-op; closing the handle returned by
// Open closes the file for all.
func (s *Store) Namespace(ns string) (*Store, error) {
	if s.b.closed.Load() {
		return nil, idem.ErrClosed
	}
	return s.b.handle(ns)
}

// Path is the file the store lives in.
func (s *Store) Path() string { return s.b.cfg.Path }

// Close stops the sweeper and the commit loop and closes the file. Pending
// operations fail with idem.ErrClosed; none is half-applied. Closing a
// handle from Namespace is a no-op.
func (s *Store) Close() error {
	if !s.root {
		return nil
	}
	return s.b.close()
}

func (b *backend) close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(b.stop)
	<-b.sweep
	<-b.loop
	if err := b.bolt.Close(); err != nil {
		return fmt.Errorf("boltstore: close %s: %w", b.cfg.Path, err)
	}
	return nil
}

// space is a namespace's buckets inside one transaction. In a write
// transaction delta collects the changes to the per-state counts, written
// once per commit by wtx.flush rather than once per operation, and written
// collects the keys whose record the transaction puts or deletes.
type space struct {
	ns, r, x, p *bbolt.Bucket
	delta       *[4]int64
	written     map[string]struct{}
}

// wtx is a write transaction shared by the operations of one group commit.
type wtx struct {
	tx     *bbolt.Tx
	spaces map[string]space
}

func (w *wtx) space(name []byte) (space, error) {
	if sp, ok := w.spaces[string(name)]; ok {
		return sp, nil
	}
	sp, err := spaceOf(w.tx, name)
	if err != nil {
		return sp, err
	}
	sp.delta = new([4]int64)
	sp.written = map[string]struct{}{}
	if w.spaces == nil {
		w.spaces = map[string]space{}
	}
	w.spaces[string(name)] = sp
	return sp, nil
}

// flush adds the collected count changes to the stored counts.
func (w *wtx) flush() error {
	for _, sp := range w.spaces {
		if *sp.delta == [4]int64{} {
			continue
		}
		c := sp.counts()
		v := make([]byte, 32)
		for i := range c {
			binary.BigEndian.PutUint64(v[8*i:], uint64(c[i]+sp.delta[i]))
		}
		if err := sp.ns.Put(countsKey, v); err != nil {
			return err
		}
	}
	return nil
}

func spaceOf(tx *bbolt.Tx, name []byte) (space, error) {
	nb := tx.Bucket(name)
	if nb == nil {
		return space{}, fmt.Errorf("%w: %w: namespace bucket %q is missing", idem.ErrUnavailable, ErrCorrupt, name)
	}
	sp := space{ns: nb, r: nb.Bucket(recordsBucket), x: nb.Bucket(expiryBucket), p: nb.Bucket(progressIndex)}
	if sp.r == nil || sp.x == nil || sp.p == nil {
		return space{}, fmt.Errorf("%w: %w: namespace bucket %q lacks a sub-bucket", idem.ErrUnavailable, ErrCorrupt, name)
	}
	return sp, nil
}

// load returns the stored record of key, live or not (nil if none). A
// record that fails to decode is an error of that key alone (idem.ErrCorrupt
// and ErrCorrupt): callers answer it to the operation on that key and go on
// with the others.
func (sp space) load(key []byte) (*rec, error) {
	v := sp.r.Get(key)
	if v == nil {
		return nil, nil
	}
	r, err := decode(key, v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w: key %q: %w", idem.ErrCorrupt, ErrCorrupt, key, err)
	}
	return &r, nil
}

// put stores r as the record of key, replacing old (nil if none) and keeping
// the expiry and in-progress indexes and the counts in step.
func (sp space) put(key []byte, old, r *rec) error {
	sp.written[string(key)] = struct{}{}
	if old == nil || old.expiresAt != r.expiresAt {
		if old != nil {
			if err := sp.x.Delete(expiryKey(old.expiresAt, key)); err != nil {
				return err
			}
		}
		if err := sp.x.Put(expiryKey(r.expiresAt, key), nil); err != nil {
			return err
		}
	}
	wasIP, isIP := old != nil && old.state == idem.StateInProgress, r.state == idem.StateInProgress
	if wasIP && (!isIP || old.token != r.token) {
		if err := sp.p.Delete(progressKey(old.token, key)); err != nil {
			return err
		}
	}
	if isIP && (!wasIP || old.token != r.token) {
		if err := sp.p.Put(progressKey(r.token, key), nil); err != nil {
			return err
		}
	}
	if old == nil || old.state != r.state {
		sp.count(old, -1)
		sp.count(r, 1)
	}
	return sp.r.Put(key, r.encode(key))
}

// del removes the record old of key and its index entries.
func (sp space) del(key []byte, old *rec) error {
	sp.written[string(key)] = struct{}{}
	if err := sp.x.Delete(expiryKey(old.expiresAt, key)); err != nil {
		return err
	}
	if old.state == idem.StateInProgress {
		if err := sp.p.Delete(progressKey(old.token, key)); err != nil {
			return err
		}
	}
	sp.count(old, -1)
	return sp.r.Delete(key)
}

func (sp space) counts() [4]int64 {
	var c [4]int64
	if v := sp.ns.Get(countsKey); len(v) == 32 {
		for i := range c {
			c[i] = int64(binary.BigEndian.Uint64(v[8*i:]))
		}
	}
	return c
}

func (sp space) count(r *rec, delta int64) {
	if r != nil {
		sp.delta[r.state-idem.StateInProgress] += delta
	}
}

// claimTx applies one claim. It returns the claim, the claim's own error
// (fingerprint mismatch, a damaged record) and a fatal error that aborts the
// transaction.
func claimTx(sp space, req *idem.ClaimRequest, now int64) (idem.Claim, error, error) {
	old, err := sp.load(req.Key)
	if err != nil {
		return idem.Claim{}, err, nil // a damaged record: this key's answer, nothing written
	}
	if old != nil && old.expiresAt <= now {
		// Past retention: absent. Drop it so the new record starts clean.
		if err := sp.del(req.Key, old); err != nil {
			return idem.Claim{}, nil, err
		}
		old = nil
	}
	if c, done, err := settled(old, req, now); done || err != nil {
		return c, err, nil
	}
	token, err := sp.ns.NextSequence()
	if err != nil {
		return idem.Claim{}, nil, err
	}
	lease, ttl := int64(req.Lease), int64(req.TTL)
	var r rec
	if old == nil {
		r = rec{attempts: 1, fp: clone(req.Fingerprint), created: now}
	} else {
		r = *old
		r.attempts++
		if len(r.fp) == 0 {
			r.fp = clone(req.Fingerprint)
		}
	}
	r.state, r.token, r.ttl, r.updated = idem.StateInProgress, token, ttl, now
	r.leaseUntil = now + lease
	r.expiresAt = max(now+ttl, r.leaseUntil)
	if err := sp.put(req.Key, old, &r); err != nil {
		return idem.Claim{}, nil, err
	}
	return idem.Claim{Outcome: idem.OutcomeAcquired, Record: r.record(req.Key)}, nil, nil
}

// settled answers a claim of a live record that it cannot acquire (done is
// then true); a nil record or one open to takeover gives done false.
func settled(r *rec, req *idem.ClaimRequest, now int64) (c idem.Claim, done bool, err error) {
	if r == nil {
		return c, false, nil
	}
	if len(r.fp) > 0 && len(req.Fingerprint) > 0 && !bytes.Equal(r.fp, req.Fingerprint) {
		return c, true, fmt.Errorf("%w: key %q", idem.ErrFingerprintMismatch, req.Key)
	}
	switch {
	case r.state == idem.StateCompleted:
		return idem.Claim{Outcome: idem.OutcomeCompleted, Record: r.record(req.Key)}, true, nil
	case r.state == idem.StateFailed:
		return idem.Claim{Outcome: idem.OutcomeFailed, Record: r.record(req.Key)}, true, nil
	case r.state == idem.StateInProgress && r.leaseUntil > now:
		return idem.Claim{Outcome: idem.OutcomeInProgress, Record: r.record(req.Key)}, true, nil
	}
	return c, false, nil
}

func (s *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.b.closed.Load() {
		return idem.ErrClosed
	}
	return nil
}

// Claim implements idem.Store. A claim that finds the key completed, failed
// or held is answered from a read transaction on a durable snapshot (see
// backend.view) without queueing a commit; only a claim that may acquire
// goes through the commit loop, which decides again.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idem.Claim{}, err
	}
	req.Key, req.Fingerprint = clone(req.Key), clone(req.Fingerprint)
	var (
		c    idem.Claim
		done bool
		cerr error
	)
	err := s.b.view(ctx, s.name, req.Key, func(tx *bbolt.Tx) error {
		sp, err := spaceOf(tx, s.name)
		if err != nil {
			return err
		}
		now := s.b.cfg.Clock.Now().UnixNano()
		r, err := sp.load(req.Key)
		if err != nil || r == nil || r.expiresAt <= now {
			return err
		}
		c, done, cerr = settled(r, &req, now)
		return nil
	})
	if err != nil {
		return idem.Claim{}, err
	}
	if done {
		return c, cerr
	}
	err = s.b.do(ctx, func(w *wtx, now int64) (error, error) {
		sp, err := w.space(s.name)
		if err != nil {
			return nil, err
		}
		var fatal error
		c, cerr, fatal = claimTx(sp, &req, now)
		return cerr, fatal
	})
	if err != nil {
		return idem.Claim{}, err
	}
	return c, nil
}

// ClaimBatch implements idem.BatchClaimer: every entry is applied, in order,
// in ONE transaction (one commit, one fsync), at one instant.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	out := make([]idem.BatchResult, len(reqs))
	own := make([]idem.ClaimRequest, len(reqs))
	for i, req := range reqs {
		if err := idem.ValidateClaim(req); err != nil {
			out[i].Err = err
			continue
		}
		own[i] = idem.ClaimRequest{Key: clone(req.Key), Fingerprint: clone(req.Fingerprint), Lease: req.Lease, TTL: req.TTL}
	}
	valid := 0
	for i := range own {
		if own[i].Key != nil {
			valid++
		}
	}
	if valid == 0 {
		return out, nil // nothing to commit
	}
	err := s.b.do(ctx, func(w *wtx, now int64) (error, error) {
		sp, err := w.space(s.name)
		if err != nil {
			return nil, err
		}
		for i := range own {
			if own[i].Key == nil {
				continue
			}
			var fatal error
			out[i].Claim, out[i].Err, fatal = claimTx(sp, &own[i], now)
			if fatal != nil {
				return nil, fatal
			}
		}
		return nil, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// settleFn changes a record held by the presented token; it reports whether
// it changed anything, or a contract error (ErrFenced) for a wrong state.
type settleFn func(r *rec, now int64) (changed bool, err error)

// settle applies fn to the live record held by token, in the commit loop.
func (s *Store) settle(ctx context.Context, key []byte, token uint64, fn settleFn) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	key = clone(key)
	return s.b.do(ctx, func(w *wtx, now int64) (error, error) {
		sp, err := w.space(s.name)
		if err != nil {
			return nil, err
		}
		return settleTx(sp, key, token, now, fn)
	})
}

// settleTx applies fn to the live record of key held by token inside a write
// transaction. It returns the operation's own answer (ErrNotFound, ErrFenced,
// idem.ErrCorrupt) and a fatal error that aborts the transaction.
func settleTx(sp space, key []byte, token uint64, now int64, fn settleFn) (error, error) {
	old, err := sp.load(key)
	if err != nil {
		return err, nil // a damaged record: this key's answer, nothing written
	}
	if old == nil || old.expiresAt <= now {
		return fmt.Errorf("%w: key %q", idem.ErrNotFound, key), nil
	}
	if old.token != token {
		return fmt.Errorf("%w: key %q: token %d, current %d", idem.ErrFenced, key, token, old.token), nil
	}
	r := *old
	changed, err := fn(&r, now)
	if err != nil {
		return fmt.Errorf("%w: key %q is %s", err, key, old.state), nil
	}
	if !changed {
		return nil, nil
	}
	r.updated = now
	return nil, sp.put(key, old, &r)
}

// completeFn is Complete's change: InProgress -> Completed with result (which
// the caller has validated and cloned); a repeat on Completed is a no-op.
func completeFn(result []byte) settleFn {
	return func(r *rec, now int64) (bool, error) {
		switch r.state {
		case idem.StateCompleted:
			return false, nil
		case idem.StateInProgress:
			r.state, r.result = idem.StateCompleted, result
			r.leaseUntil, r.expiresAt = 0, now+r.ttl
			return true, nil
		}
		return false, idem.ErrFenced
	}
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	if err := idem.ValidateResult(result); err != nil {
		return err
	}
	return s.settle(ctx, key, token, completeFn(clone(result)))
}

// CompleteBatch implements idem.BatchCompleter: every valid entry is applied
// by Complete's own code (settleTx with completeFn), independently, in ONE
// operation of the commit loop (one transaction, one fsync). Invalid entries
// get their error before anything is queued. errs[i] is what Complete would
// have returned; a returned error means the commit failed and nothing of the
// call is known to be durable (ErrUnavailable when nothing was applied,
// ErrUnknownOutcome otherwise), and errs is then nil.
func (s *Store) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	return s.settleBatch(ctx, len(cs), func(i int) ([]byte, uint64, settleFn, error) {
		c := &cs[i]
		if err := idem.ValidateResult(c.Result); err != nil {
			return nil, 0, nil, err
		}
		return c.Key, c.Token, completeFn(clone(c.Result)), nil
	})
}

// ExtendBatch implements idem.BatchExtender as CompleteBatch does
// completions: every valid entry applied by Extend's own code, in one
// transaction and one fsync (the guard's heartbeat sends the claims due in
// a tick this way, instead of one commit each).
func (s *Store) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	return s.settleBatch(ctx, len(es), func(i int) ([]byte, uint64, settleFn, error) {
		x := &es[i]
		if err := idem.ValidateLease(x.Lease); err != nil {
			return nil, 0, nil, err
		}
		return x.Key, x.Token, extendFn(x.Lease), nil
	})
}

// settleBatch applies n token operations in one operation of the commit
// loop; entry(i) returns entry i's key, token and operation, or its own
// validation error. See CompleteBatch.
func (s *Store) settleBatch(ctx context.Context, n int, entry func(i int) ([]byte, uint64, settleFn, error)) ([]error, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	type op struct {
		key   []byte
		token uint64
		fn    settleFn
	}
	errs := make([]error, n)
	own := make([]op, n)
	valid := 0
	for i := range n {
		key, token, fn, err := entry(i)
		if err == nil {
			err = idem.ValidateToken(key, token)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		own[i] = op{clone(key), token, fn}
		valid++
	}
	if valid == 0 {
		return errs, nil // nothing to commit
	}
	answers := make([]error, n)
	err := s.b.do(ctx, func(w *wtx, now int64) (error, error) {
		sp, err := w.space(s.name)
		if err != nil {
			return nil, err
		}
		for i := range own {
			if own[i].key == nil {
				continue
			}
			var fatal error
			if answers[i], fatal = settleTx(sp, own[i].key, own[i].token, now, own[i].fn); fatal != nil {
				return nil, fatal
			}
		}
		return nil, nil
	})
	if err != nil {
		return nil, err
	}
	for i := range own {
		if own[i].key != nil {
			errs[i] = answers[i]
		}
	}
	return errs, nil
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.settle(ctx, key, token, func(r *rec, now int64) (bool, error) {
		switch r.state {
		case idem.StateReleased:
			return false, nil
		case idem.StateInProgress:
			r.state, r.leaseUntil = idem.StateReleased, 0
			if cause != "" {
				r.lastErr = cause
			}
			return true, nil
		}
		return false, idem.ErrFenced
	})
}

// Fail implements idem.Store.
func (s *Store) Fail(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.settle(ctx, key, token, func(r *rec, now int64) (bool, error) {
		switch r.state {
		case idem.StateFailed:
			return false, nil
		case idem.StateInProgress:
			r.state, r.lastErr = idem.StateFailed, cause
			r.leaseUntil, r.expiresAt = 0, now+r.ttl
			return true, nil
		}
		return false, idem.ErrFenced
	})
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	if err := idem.ValidateLease(lease); err != nil {
		return err
	}
	return s.settle(ctx, key, token, extendFn(lease))
}

func extendFn(lease time.Duration) settleFn {
	return func(r *rec, now int64) (bool, error) {
		if r.state != idem.StateInProgress {
			return false, idem.ErrFenced
		}
		r.leaseUntil = now + int64(lease)
		r.expiresAt = max(r.expiresAt, r.leaseUntil)
		return true, nil
	}
}

// view runs fn in a read transaction on the namespace's buckets. key is the
// one record fn reads, or nil if it reads more (see backend.view).
func (s *Store) view(ctx context.Context, key []byte, fn func(sp space, now int64) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.b.view(ctx, s.name, key, func(tx *bbolt.Tx) error {
		sp, err := spaceOf(tx, s.name)
		if err != nil {
			return err
		}
		return fn(sp, s.b.cfg.Clock.Now().UnixNano())
	})
}

// Get implements idem.Store. It reads a durable snapshot: never one of a
// commit whose fdatasync has not returned (see backend.view).
func (s *Store) Get(ctx context.Context, key []byte) (idem.Record, error) {
	if err := idem.ValidateKey(key); err != nil {
		return idem.Record{}, err
	}
	var out idem.Record
	err := s.view(ctx, key, func(sp space, now int64) error {
		r, err := sp.load(key)
		if err != nil {
			return err
		}
		if r == nil || r.expiresAt <= now {
			return fmt.Errorf("%w: key %q", idem.ErrNotFound, key)
		}
		out = r.record(key)
		return nil
	})
	return out, err
}

// Delete implements idem.Store. The namespace's token counter is kept, so a
// later claim of the key still gets a larger token.
func (s *Store) Delete(ctx context.Context, key []byte) error {
	if err := idem.ValidateKey(key); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	key = clone(key)
	return s.b.do(ctx, func(w *wtx, _ int64) (error, error) {
		sp, err := w.space(s.name)
		if err != nil {
			return nil, err
		}
		old, err := sp.load(key)
		if err != nil || old == nil {
			// A damaged record stays: without it the index entries that
			// point at it cannot be found (see docs/boltstore.md).
			return err, nil
		}
		return nil, sp.del(key, old)
	})
}

// purgeResult is what one purge transaction did.
type purgeResult struct {
	removed, damaged int
	// next is where the following transaction starts in the expiry index
	// (nil: no due entry is left after this one's).
	next []byte
}

// purgeTx examines up to n due entries of the expiry index of namespace
// bucket name, from its oldest entry at or after from, and removes their
// expired records: the work is proportional to what has expired, not to the
// size of the store. A record that fails to decode is left alone and
// counted (nothing proves it expired); the next transaction starts after it,
// so damaged records never stall the purge.
func purgeTx(w *wtx, name []byte, now int64, n int, from []byte) (purgeResult, error) {
	var res purgeResult
	sp, err := w.space(name)
	if err != nil {
		return res, err
	}
	// Collect first: deleting under a bbolt cursor can skip entries.
	var due [][]byte
	c := sp.x.Cursor()
	k, _ := c.First()
	if from != nil {
		k, _ = c.Seek(from)
	}
	for ; k != nil && len(due) < n; k, _ = c.Next() {
		if len(k) < 8 || int64(binary.BigEndian.Uint64(k)) > now {
			break
		}
		due = append(due, clone(k))
	}
	if len(due) == n {
		res.next = append(clone(due[n-1]), 0) // the least key after it
	}
	for _, k := range due {
		exp, key := int64(binary.BigEndian.Uint64(k)), k[8:]
		r, err := sp.load(key)
		if err != nil {
			res.damaged++
			continue
		}
		if r != nil && r.expiresAt == exp && exp <= now {
			if err := sp.del(key, r); err != nil {
				return res, err
			}
			res.removed++
			continue
		}
		if err := sp.x.Delete(k); err != nil { // stale index entry
			return res, err
		}
	}
	return res, nil
}

// Purge implements idem.Purger: expired records go in transactions of at
// most Config.SweepChunk records, each queued with the claims.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	return s.b.purge(ctx, s.name, limit)
}

// ListInProgress implements idem.Lister from the in-progress index, in claim
// (token) order: the longest-held keys first. The cursor is the hex of the
// last index entry returned.
func (s *Store) ListInProgress(ctx context.Context, cursor string, limit int) ([]idem.Record, string, error) {
	after, err := hex.DecodeString(cursor)
	if err != nil {
		return nil, "", fmt.Errorf("%w: boltstore: bad cursor %q", idem.ErrInvalidArgument, cursor)
	}
	if limit <= 0 {
		limit = 100
	}
	var (
		out  []idem.Record
		next string
	)
	err = s.view(ctx, nil, func(sp space, now int64) error {
		c := sp.p.Cursor()
		k, _ := c.First()
		if len(after) > 0 {
			if k, _ = c.Seek(after); k != nil && bytes.Equal(k, after) {
				k, _ = c.Next()
			}
		}
		var last []byte
		for ; k != nil; k, _ = c.Next() {
			if len(k) < 8 {
				return fmt.Errorf("%w: %w: in-progress index entry %x", idem.ErrUnavailable, ErrCorrupt, k)
			}
			key := k[8:]
			r, err := sp.load(key)
			if err != nil {
				// One damaged record does not hide the others' stuck work.
				s.b.cfg.Logger.Warn("boltstore: ListInProgress skipped a record it cannot decode", "path", s.b.cfg.Path, "err", err)
				continue
			}
			if r == nil || r.state != idem.StateInProgress || r.token != binary.BigEndian.Uint64(k) || r.expiresAt <= now {
				continue
			}
			if len(out) == limit {
				next = hex.EncodeToString(last)
				break
			}
			out = append(out, r.record(key))
			last = append(last[:0], k...)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

// Stats implements idem.Stater: the stored counts, less the records past
// retention that the sweeper has not removed yet (found through the expiry
// index, so the cost is proportional to those).
func (s *Store) Stats(ctx context.Context) (idem.Stats, error) {
	var st idem.Stats
	err := s.view(ctx, nil, func(sp space, now int64) error {
		c := sp.counts()
		cur := sp.x.Cursor()
		for k, _ := cur.First(); k != nil && len(k) >= 8 && int64(binary.BigEndian.Uint64(k)) <= now; k, _ = cur.Next() {
			r, err := sp.load(k[8:])
			if err != nil {
				continue // damaged: its state is unknown, it stays counted
			}
			if r != nil && r.expiresAt == int64(binary.BigEndian.Uint64(k)) {
				c[r.state-idem.StateInProgress]--
			}
		}
		st = idem.Stats{InProgress: c[0], Completed: c[1], Failed: c[2], Released: c[3]}
		return nil
	})
	return st, err
}

// Ping implements idem.Pinger: the file answers a read and accepts writes
// (it fails once a failed commit has disabled writes).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.view(ctx, nil, func(space, int64) error { return nil }); err != nil {
		return err
	}
	return s.b.writeDisabled()
}

var (
	_ idem.Store          = (*Store)(nil)
	_ idem.BatchClaimer   = (*Store)(nil)
	_ idem.BatchCompleter = (*Store)(nil)
	_ idem.BatchExtender  = (*Store)(nil)
	_ idem.Purger         = (*Store)(nil)
	_ idem.Lister         = (*Store)(nil)
	_ idem.Stater         = (*Store)(nil)
	_ idem.Pinger         = (*Store)(nil)
)
