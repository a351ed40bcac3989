package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
)

// keyQueue holds the batch entries for one key, in request order. rec is
// the record as it stood after the last settled entry (nil: ask the server).
type keyQueue struct {
	ref  keyRef
	idxs []int
	pos  int
	rec  *row
}

// ClaimBatch implements idem.BatchClaimer: one round trip for the whole
// batch (one statement per table touched, pipelined), with every key's
// outcome read back. Repeated keys are settled in Go against the record the
// earlier entry left, exactly as claims one after another would be; only a
// repeat that would take the key over again (after its first entry got a
// fingerprint mismatch on a released record) costs another round trip.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	return s.claimBatch(ctx, s.pool, reqs, false)
}

func (s *Store) claimBatch(ctx context.Context, q querier, reqs []idem.ClaimRequest, inTx bool) ([]idem.BatchResult, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	out := make([]idem.BatchResult, len(reqs))
	byKey := make(map[string]*keyQueue, len(reqs))
	slab := make([]keyQueue, 0, len(reqs)) // never grows: pointers into it stay valid
	var queues []*keyQueue
	var refs []keyRef
	for i, req := range reqs {
		if err := idem.ValidateClaim(req); err != nil {
			out[i].Err = err
			continue
		}
		kq := byKey[string(req.Key)]
		if kq == nil {
			r, err := s.ref(req.Key)
			if err != nil {
				out[i].Err = err
				continue
			}
			slab = append(slab, keyQueue{ref: r})
			kq = &slab[len(slab)-1]
			byKey[string(req.Key)] = kq
			queues = append(queues, kq)
			refs = append(refs, r)
		}
		kq.idxs = append(kq.idxs, i)
	}
	if len(queues) == 0 {
		return out, nil
	}
	if err := s.ensurePartitionsFor(ctx, refs); err != nil {
		return nil, err
	}
	applied := false
	for round := 0; ; round++ {
		// Settle what can be settled in Go; collect one entry per key that
		// needs the server.
		var send []*keyQueue
		for _, kq := range queues {
			for kq.pos < len(kq.idxs) {
				if kq.rec == nil {
					send = append(send, kq)
					break
				}
				i := kq.idxs[kq.pos]
				c, err := classify(*kq.rec, reqs[i])
				if err == errSettle {
					kq.rec = nil
					continue
				}
				out[i] = idem.BatchResult{Claim: c, Err: err}
				kq.rec.acquired = false // later entries see it as held
				kq.pos++
			}
		}
		if len(send) == 0 {
			return out, nil
		}
		if round >= maxSettle {
			return nil, s.batchErr(ctx, errSettle, applied)
		}
		rows, err := s.runBatch(ctx, q, reqs, send)
		if err != nil {
			if !inTx && s.retryable(ctx, err) {
				if isNoPartition(err) {
					s.forgetPartitions()
					if perr := s.ensurePartitionsFor(ctx, refs); perr != nil {
						return nil, s.batchErr(ctx, perr, applied)
					}
				}
				continue
			}
			return nil, s.batchErr(ctx, err, applied)
		}
		applied = true
		for _, kq := range send {
			r, ok := rows[string(kq.ref.hash)]
			if !ok {
				continue // inserted by someone after our snapshot: ask again
			}
			i := kq.idxs[kq.pos]
			c, err := classify(*r, reqs[i])
			if err == errSettle {
				continue
			}
			out[i] = idem.BatchResult{Claim: c, Err: err}
			if errors.Is(err, idem.ErrUnavailable) { // hash collision
				out[i] = idem.BatchResult{}
				return nil, s.batchErr(ctx, err, applied)
			}
			r.acquired = false // later entries of the key see it as held
			kq.rec = r
			kq.pos++
		}
	}
}

func (s *Store) batchErr(ctx context.Context, err error, applied bool) error {
	if applied {
		// Earlier rounds took effect: the batch as a whole is unknown.
		return fmt.Errorf("%w: pgstore: batch partly applied: %w", idem.ErrUnknownOutcome, err)
	}
	return s.mapErr(ctx, err, true)
}

func (s *Store) forgetPartitions() {
	s.partMu.Lock()
	clear(s.parts)
	s.partMu.Unlock()
}

// runBatch sends one claim statement per table touched (pipelined in one
// round trip) and returns the rows by key hash.
func (s *Store) runBatch(ctx context.Context, q querier, reqs []idem.ClaimRequest, send []*keyQueue) (map[string]*row, error) {
	// Rows go to the server sorted by index key, so concurrent batches
	// lock rows in the same order and do not deadlock each other.
	slices.SortFunc(send, func(a, b *keyQueue) int {
		if a.ref.table != b.ref.table {
			return a.ref.table - b.ref.table
		}
		if c := a.ref.ktime.Compare(b.ref.ktime); c != 0 {
			return c
		}
		return bytes.Compare(a.ref.hash, b.ref.hash)
	})
	type group struct {
		table int
		args  []any
	}
	var groups []group
	for lo := 0; lo < len(send); {
		hi := lo
		for hi < len(send) && send[hi].ref.table == send[lo].ref.table {
			hi++
		}
		n := hi - lo
		hashes, keys, fps := make([][]byte, n), make([][]byte, n), make([][]byte, n)
		leases, ttls := make([]int64, n), make([]int64, n)
		var times []time.Time
		if s.cfg.Layout.timed() {
			times = make([]time.Time, n)
		}
		for j, kq := range send[lo:hi] {
			req := reqs[kq.idxs[kq.pos]]
			hashes[j], keys[j], fps[j] = kq.ref.hash, req.Key, req.Fingerprint
			leases[j], ttls[j] = req.Lease.Microseconds(), req.TTL.Microseconds()
			if times != nil {
				times[j] = kq.ref.ktime
			}
		}
		args := []any{s.ns, hashes, keys, fps, leases, ttls}
		if times != nil {
			args = append(args, times)
		}
		groups = append(groups, group{send[lo].ref.table, args})
		lo = hi
	}
	// Rows are scanned into one slice with one reused target list: a
	// batch of 100 otherwise costs thousands of small allocations.
	got := make([]row, 0, len(send))
	out := make(map[string]*row, len(send))
	dst := make([]any, 0, 15)
	collect := func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			if len(got) == cap(got) {
				return fmt.Errorf("pgstore: batch returned more rows than keys")
			}
			got = append(got, row{})
			r := &got[len(got)-1]
			if err := rows.Scan(r.targets(dst[:0], true)...); err != nil {
				return err
			}
			out[string(r.hash)] = r
		}
		return rows.Err()
	}
	if len(groups) == 1 {
		rows, err := q.Query(ctx, s.tables[groups[0].table].batch, groups[0].args...)
		if err != nil {
			return nil, err
		}
		return out, collect(rows)
	}
	b := &pgx.Batch{}
	for _, g := range groups {
		b.Queue(s.tables[g.table].batch, g.args...)
	}
	br := q.SendBatch(ctx, b)
	for range groups {
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return nil, err
		}
		if err := collect(rows); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	return out, br.Close()
}

// CompleteBatch implements idem.BatchCompleter: one token-checked UPDATE
// per entry (the same statement as Complete), pipelined in one round trip.
// Each entry is judged on its own; an entry whose statement raced a
// concurrent change is settled with a follow-up Complete.
func (s *Store) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	errs := make([]error, len(cs))
	type entry struct {
		i   int
		ref keyRef
		res []byte
	}
	var todo []entry
	for i, c := range cs {
		if err := idem.ValidateToken(c.Key, c.Token); err != nil {
			errs[i] = err
			continue
		}
		if err := idem.ValidateResult(c.Result); err != nil {
			errs[i] = err
			continue
		}
		if c.Token > 1<<63-1 {
			errs[i] = fmt.Errorf("%w: token %d was never issued", idem.ErrFenced, c.Token)
			continue
		}
		r, err := s.ref(c.Key)
		if err != nil {
			errs[i] = err
			continue
		}
		res := c.Result
		if res == nil {
			res = []byte{}
		}
		todo = append(todo, entry{i, r, res})
	}
	if len(todo) == 0 {
		return errs, nil
	}
	b := &pgx.Batch{}
	for _, e := range todo {
		b.Queue(s.tables[e.ref.table].mut[mutComplete], s.args(e.ref, int64(cs[e.i].Token), e.res)...)
	}
	type answer struct {
		done  bool
		state *int16
		cur   *int64
		key   []byte
	}
	answers := make([]answer, len(todo))
	br := s.pool.SendBatch(ctx, b)
	for j := range todo {
		a := &answers[j]
		if err := br.QueryRow().Scan(&a.done, &a.state, &a.cur, &a.key); err != nil {
			_ = br.Close()
			return nil, s.mapErr(ctx, err, true)
		}
	}
	if err := br.Close(); err != nil {
		return nil, s.mapErr(ctx, err, true)
	}
	for j, e := range todo {
		a, tok := answers[j], cs[e.i].Token
		switch {
		case a.done:
		case a.state == nil || !bytes.Equal(a.key, e.ref.key):
			errs[e.i] = fmt.Errorf("%w: key %q", idem.ErrNotFound, e.ref.key)
		case uint64(*a.cur) == tok && *a.state == stCompleted:
		case uint64(*a.cur) == tok && *a.state == stInProgress:
			// Our snapshot predates a concurrent change: ask again alone.
			errs[e.i] = s.mutate(ctx, s.pool, mutComplete, e.ref, tok, e.res, false)
		default:
			errs[e.i] = fmt.Errorf("%w: key %q token %d (current %d, %s)", idem.ErrFenced, e.ref.key, tok, *a.cur, idem.State(*a.state))
		}
		if errs[e.i] != nil && !errors.Is(errs[e.i], idem.ErrNotFound) && !errors.Is(errs[e.i], idem.ErrFenced) {
			return nil, errs[e.i] // the follow-up failed as a whole
		}
	}
	return errs, nil
}
