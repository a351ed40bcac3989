// Package faultstore wraps an idem.Store to inject faults: a store that is
// down, calls that fail N times, calls that are applied but whose answer is
// lost (unknown outcome), delays, and faults limited to some keys. Tests of
// the guard, the consumer runtime and the fault harness use it to
// reproduce the fault catalogue (F4, F10, F17) deterministically.
package faultstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idem-dev/idem"
)

// Op names a Store method.
type Op string

const (
	OpClaim         Op = "claim"
	OpBatch         Op = "batch"
	OpComplete      Op = "complete"
	OpCompleteBatch Op = "complete-batch"
	OpRelease       Op = "release"
	OpFail          Op = "fail"
	OpExtend        Op = "extend"
	OpExtendBatch   Op = "extend-batch"
	OpGet           Op = "get"
	OpDelete        Op = "delete"
)

// Fault is one injected failure.
type Fault struct {
	Err error // returned to the caller (default idem.ErrUnavailable)
	// Applied: the call reaches the inner store first and only its answer
	// is lost, as when a connection drops after the server committed.
	Applied bool
	Times   int           // how many calls it affects (0: until cleared)
	Delay   time.Duration // sleep before the call (honouring ctx)
	// Keys, when set, limits the fault to calls on the keys it reports
	// true for; calls on other keys go through untouched. It is called
	// with the store's lock held and must not call the store. In a batch
	// call (ClaimBatch, CompleteBatch, ExtendBatch) only the matching entries fail,
	// each with Err, and the others reach the inner store (Applied,
	// Times and Delay do not apply to entries).
	Keys func(key []byte) bool
}

// Store is a fault-injecting idem.Store. Its batch capabilities
// (idem.BatchClaimer, idem.BatchCompleter, idem.BatchExtender) come with
// WithBatch.
type Store struct {
	inner  idem.Store
	mu     sync.Mutex
	faults map[Op]*Fault
	down   bool
	calls  map[Op]int
}

// New wraps inner.
func New(inner idem.Store) *Store {
	return &Store{inner: inner, faults: map[Op]*Fault{}, calls: map[Op]int{}}
}

// Inject sets the fault for op, replacing any earlier one.
func (s *Store) Inject(op Op, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.Err == nil {
		f.Err = idem.ErrUnavailable
	}
	s.faults[op] = &f
}

// Clear removes every fault and brings the store back up.
func (s *Store) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = map[Op]*Fault{}
	s.down = false
}

// SetDown makes every call fail with idem.ErrUnavailable (store outage).
func (s *Store) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// Calls reports how many calls of op were made (faulted or not).
func (s *Store) Calls(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// before returns the fault for this call on key, if any; applied reports
// whether the inner call must still run. A batch call passes a nil key:
// a fault limited to keys is left to it, entry by entry (see keyed).
func (s *Store) before(ctx context.Context, op Op, key []byte) (err error, applied bool) {
	s.mu.Lock()
	s.calls[op]++
	if s.down {
		s.mu.Unlock()
		return fmt.Errorf("faultstore: %s: store down: %w", op, idem.ErrUnavailable), false
	}
	f := s.faults[op]
	if f == nil || f.Keys != nil && (key == nil || !f.Keys(key)) {
		s.mu.Unlock()
		return nil, true
	}
	if f.Times > 0 {
		f.Times--
		if f.Times == 0 {
			delete(s.faults, op)
		}
	}
	fc := *f
	s.mu.Unlock()
	if fc.Delay > 0 {
		t := time.NewTimer(fc.Delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err(), false
		case <-t.C:
		}
	}
	return fmt.Errorf("faultstore: %s: %w", op, fc.Err), fc.Applied
}

// keyed returns which entries of a batch call of op fail, and with what
// error, when op's fault is limited to keys; nil otherwise.
func (s *Store) keyed(op Op) (match func(key []byte) bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults[op]
	if f == nil || f.Keys == nil {
		return nil, nil
	}
	keys, ferr := f.Keys, f.Err
	return func(k []byte) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return keys(k)
	}, fmt.Errorf("faultstore: %s: %w", op, ferr)
}

func do[T any](s *Store, ctx context.Context, op Op, key []byte, call func() (T, error)) (T, error) {
	ferr, apply := s.before(ctx, op, key)
	var zero T
	if !apply {
		return zero, ferr
	}
	v, err := call()
	if ferr != nil {
		return zero, ferr
	}
	return v, err
}

type none struct{}

func do0(s *Store, ctx context.Context, op Op, key []byte, call func() error) error {
	_, err := do(s, ctx, op, key, func() (none, error) { return none{}, call() })
	return err
}

func (s *Store) Claim(ctx context.Context, r idem.ClaimRequest) (idem.Claim, error) {
	return do(s, ctx, OpClaim, r.Key, func() (idem.Claim, error) { return s.inner.Claim(ctx, r) })
}

func (s *Store) Complete(ctx context.Context, k []byte, tok uint64, res []byte) error {
	return do0(s, ctx, OpComplete, k, func() error { return s.inner.Complete(ctx, k, tok, res) })
}

func (s *Store) Release(ctx context.Context, k []byte, tok uint64, cause string) error {
	return do0(s, ctx, OpRelease, k, func() error { return s.inner.Release(ctx, k, tok, cause) })
}

func (s *Store) Fail(ctx context.Context, k []byte, tok uint64, cause string) error {
	return do0(s, ctx, OpFail, k, func() error { return s.inner.Fail(ctx, k, tok, cause) })
}

func (s *Store) Extend(ctx context.Context, k []byte, tok uint64, lease time.Duration) error {
	return do0(s, ctx, OpExtend, k, func() error { return s.inner.Extend(ctx, k, tok, lease) })
}

func (s *Store) Get(ctx context.Context, k []byte) (idem.Record, error) {
	return do(s, ctx, OpGet, k, func() (idem.Record, error) { return s.inner.Get(ctx, k) })
}

func (s *Store) Delete(ctx context.Context, k []byte) error {
	return do0(s, ctx, OpDelete, k, func() error { return s.inner.Delete(ctx, k) })
}

func (s *Store) Close() error { return s.inner.Close() }

// BatchStore is a Store whose inner store is an idem.BatchClaimer.
type BatchStore struct{ *Store }

// ClaimBatch forwards to the inner store's batch claim.
func (s BatchStore) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	b := s.inner.(idem.BatchClaimer)
	return do(s.Store, ctx, OpBatch, nil, func() ([]idem.BatchResult, error) {
		return perEntry(s.Store, OpBatch, reqs, func(r idem.ClaimRequest) []byte { return r.Key },
			func(err error) idem.BatchResult { return idem.BatchResult{Err: err} },
			func(reqs []idem.ClaimRequest) ([]idem.BatchResult, error) { return b.ClaimBatch(ctx, reqs) })
	})
}

// CompleteBatch forwards to the inner store's batch completion, or
// completes one by one when it has none.
func (s BatchStore) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	return do(s.Store, ctx, OpCompleteBatch, nil, func() ([]error, error) {
		return perEntry(s.Store, OpCompleteBatch, cs, func(c idem.Completion) []byte { return c.Key },
			func(err error) error { return err },
			func(cs []idem.Completion) ([]error, error) { return s.completeBatch(ctx, cs) })
	})
}

// ExtendBatch forwards to the inner store's batch extend, or extends one
// by one when it has none. Its faults are OpExtendBatch's: a fault on
// OpExtend fails single extends only (the guard's heartbeat sends batches
// to a BatchStore; to make every heartbeat fail, inject both).
func (s BatchStore) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	return do(s.Store, ctx, OpExtendBatch, nil, func() ([]error, error) {
		return perEntry(s.Store, OpExtendBatch, es, func(x idem.Extension) []byte { return x.Key },
			func(err error) error { return err },
			func(es []idem.Extension) ([]error, error) { return s.extendBatch(ctx, es) })
	})
}

// perEntry runs a batch call of op: the entries a fault limited to keys
// matches fail with its error (failed), the others go to inner in one
// call, and the answers are merged in request order.
func perEntry[E, R any](s *Store, op Op, entries []E, key func(E) []byte, failed func(error) R, inner func([]E) ([]R, error)) ([]R, error) {
	match, ferr := s.keyed(op)
	if match == nil {
		return inner(entries)
	}
	out := make([]R, len(entries))
	var rest []E
	var idx []int
	for i, e := range entries {
		if match(key(e)) {
			out[i] = failed(ferr)
			continue
		}
		rest, idx = append(rest, e), append(idx, i)
	}
	if len(rest) > 0 {
		sub, err := inner(rest)
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			out[i] = sub[j]
		}
	}
	return out, nil
}

func (s BatchStore) completeBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	if b, ok := s.inner.(idem.BatchCompleter); ok {
		return b.CompleteBatch(ctx, cs)
	}
	errs := make([]error, len(cs))
	for i, c := range cs {
		errs[i] = s.inner.Complete(ctx, c.Key, c.Token, c.Result)
	}
	return errs, nil
}

func (s BatchStore) extendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	if b, ok := s.inner.(idem.BatchExtender); ok {
		return b.ExtendBatch(ctx, es)
	}
	errs := make([]error, len(es))
	for i, x := range es {
		errs[i] = s.inner.Extend(ctx, x.Key, x.Token, x.Lease)
	}
	return errs, nil
}

// WithBatch returns s as an idem.BatchClaimer, idem.BatchCompleter and
// idem.BatchExtender too when its inner store is a BatchClaimer.
func (s *Store) WithBatch() idem.Store {
	if _, ok := s.inner.(idem.BatchClaimer); ok {
		return BatchStore{s}
	}
	return s
}
