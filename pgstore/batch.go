package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// keyQueue holds the batch entries for one key, in request order. rec is
// the record as it stood after the last settled entry (nil: ask the server);
// got is what the last runBatch read for the key (nil: nothing). ref points
// into the batch's refs slice, which is not grown after the queues exist.
type keyQueue struct {
	ref  *keyRef
	idxs []int
	pos  int
	rec  *row
	got  *row
}

// ClaimBatch implements idem.BatchClaimer. Fresh keys cost one round trip:
// one insert-only statement per table touched (pipelined), the bare
// multi-row INSERT ... ON CONFLICT DO NOTHING plus RETURNING token and time.
// Keys that already had a row come back absent and are claimed by a second
// statement, the atomic ON CONFLICT DO UPDATE ... WHERE takeover that reads
// every outcome back. Repeated keys are settled in Go against the record
// the earlier entry left, exactly as claims one after another would be;
// only a repeat that would take the key over again (after its first entry
// got a fingerprint mismatch on a released record) costs another round trip.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	return s.claimBatch(ctx, s.pool, reqs, false)
}

// sortKey orders a batch the way rows go to the server: by table, key time
// and key hash (the index order), so concurrent batches insert and lock
// rows in the same order and do not deadlock each other.
type sortKey struct {
	table    int32
	kt       int64 // key time, µs
	h0, h1   uint64
	ref, req int32
}

// sortKey is r's place in index order (table, key time, hash); ref and
// req are left to the caller.
func (r *keyRef) sortKey() sortKey {
	return sortKey{table: int32(r.table), kt: r.ktime.UnixMicro(),
		h0: binary.BigEndian.Uint64(r.hash), h1: binary.BigEndian.Uint64(r.hash[8:])}
}

func (a *sortKey) compare(b *sortKey) int {
	switch {
	case a.table != b.table:
		return int(a.table - b.table)
	case a.kt != b.kt:
		return cmp.Compare(a.kt, b.kt)
	case a.h0 != b.h0:
		return cmp.Compare(a.h0, b.h0)
	}
	return cmp.Compare(a.h1, b.h1)
}

func (s *Store) claimBatch(ctx context.Context, q querier, reqs []idem.ClaimRequest, inTx bool) ([]idem.BatchResult, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	out := make([]idem.BatchResult, len(reqs))
	// The valid requests sorted by index key (then key, then request
	// order): entries of one key end up adjacent and share one keyQueue.
	refs := make([]keyRef, 0, len(reqs))
	order := make([]sortKey, 0, len(reqs))
	for i, req := range reqs {
		if err := idem.ValidateClaim(req); err != nil {
			out[i].Err = err
			continue
		}
		r, err := s.ref(req.Key)
		if err != nil {
			out[i].Err = err
			continue
		}
		k := r.sortKey()
		k.ref, k.req = int32(len(refs)), int32(i)
		order = append(order, k)
		refs = append(refs, r)
	}
	if len(order) == 0 {
		return out, nil
	}
	slices.SortFunc(order, func(a, b sortKey) int {
		if c := a.compare(&b); c != 0 {
			return c
		}
		if c := bytes.Compare(refs[a.ref].key, refs[b.ref].key); c != 0 {
			return c
		}
		return int(a.req - b.req)
	})
	slab := make([]keyQueue, 0, len(order))
	idxBuf := make([]int, len(order))
	for j, o := range order {
		if n := len(slab); n > 0 && order[j-1].compare(&o) == 0 && bytes.Equal(slab[n-1].ref.key, refs[o.ref].key) {
			slab[n-1].idxs = append(slab[n-1].idxs, int(o.req))
			continue
		}
		idxBuf[j] = int(o.req)
		// Full capacity: a repeated key's append copies, the rest share idxBuf.
		slab = append(slab, keyQueue{ref: &refs[o.ref], idxs: idxBuf[j : j+1 : j+1]})
	}
	queues := make([]*keyQueue, len(slab))
	for j := range slab {
		queues[j] = &slab[j]
	}
	if err := s.ensurePartitionsFor(ctx, refs); err != nil {
		return nil, err
	}
	applied := false
	send := make([]*keyQueue, 0, len(queues))
	for round := 0; ; round++ {
		// Settle what can be settled in Go; collect one entry per key that
		// needs the server (in index order, as queues are).
		send = send[:0]
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
			return nil, s.batchErr(ctx, errSettle, applied, inTx)
		}
		wrote, err := s.runBatch(ctx, q, reqs, out, send, round == 0)
		applied = applied || wrote
		if err != nil {
			if isNoPartition(err) {
				if perr := s.recreatePartitions(ctx, refs); perr != nil {
					return nil, s.batchErr(ctx, perr, applied, inTx)
				}
				if inTx {
					return nil, s.partitionRetryErr(err)
				}
			}
			if !inTx && s.retryable(ctx, err) {
				continue
			}
			return nil, s.batchErr(ctx, err, applied, inTx)
		}
		for _, kq := range send {
			r := kq.got
			if r == nil {
				// Settled by runBatch's insert (kq.pos moved on), or
				// inserted by someone after our snapshot: ask again.
				continue
			}
			i := kq.idxs[kq.pos]
			c, err := classify(*r, reqs[i])
			if err == errSettle {
				continue
			}
			out[i] = idem.BatchResult{Claim: c, Err: err}
			r.acquired = false // later entries of the key see it as held
			kq.rec = r
			kq.pos++
		}
	}
}

func (s *Store) batchErr(ctx context.Context, err error, applied, inTx bool) error {
	if applied && !inTx {
		// Earlier statements took effect: the batch as a whole is unknown.
		return fmt.Errorf("%w: pgstore: batch partly applied: %w", idem.ErrUnknownOutcome, err)
	}
	return s.mapErr(ctx, err, !inTx)
}

// span is one statement's share of send: rows of one table, at most
// tokenScale of them.
type span struct{ lo, hi int }

// spans cuts send (sorted by table) into statements.
func spans(send []*keyQueue) []span {
	var sp []span
	for lo := 0; lo < len(send); {
		hi := lo
		for hi < len(send) && hi-lo < tokenScale && send[hi].ref.table == send[lo].ref.table {
			hi++
		}
		sp = append(sp, span{lo, hi})
		lo = hi
	}
	return sp
}

// runBatch claims one entry of each queue in send (sorted by index key) and
// sets each queue's got. With fast (the first round), it first runs the
// insert-only statement and sends only the keys that conflicted to the
// takeover statement. The keys the insert-only statement inserted are
// settled here, into out (their queues move on, got stays nil), once that
// statement has succeeded; so a failure of the takeover statement after it
// does not make them look taken by someone else when the batch is retried.
// wrote reports whether a statement may have taken effect.
func (s *Store) runBatch(ctx context.Context, q querier, reqs []idem.ClaimRequest, out []idem.BatchResult, send []*keyQueue, fast bool) (wrote bool, err error) {
	for _, kq := range send {
		kq.got = nil
	}
	sp := spans(send)
	rest := send
	if fast {
		args, uniform := s.batchArgs(reqs, send, sp, true)
		// What the insert returned, per entry of send: the token (-1: no
		// row came back, the key had one) and the statement time. Nothing
		// is settled until the whole pipeline has succeeded: an error means
		// none of it took effect.
		toks := make([]int64, len(send))
		for j := range toks {
			toks[j] = -1
		}
		nows := make([]time.Time, len(sp))
		n := 0
		err := s.pipeline(ctx, q, sp, args, func(j int) string {
			if uniform {
				return s.tables[send[sp[j].lo].ref.table].fastU
			}
			return s.tables[send[sp[j].lo].ref.table].fast
		}, func(j int, rows pgx.Rows) error {
			lo, hi := sp[j].lo, sp[j].hi
			var tok int64
			var now time.Time
			var nowRaw []byte
			base := int64(-1)
			fds := rows.FieldDescriptions()
			binTok := len(fds) == 2 && fds[0].Format == pgtype.BinaryFormatCode
			for rows.Next() {
				// Every row has the statement's time: scan it once, and
				// only decode the token of the rows after.
				raw := rows.RawValues()
				if nowRaw != nil && binTok && len(raw) == 2 && len(raw[0]) == 8 && bytes.Equal(raw[1], nowRaw) {
					tok = int64(binary.BigEndian.Uint64(raw[0]))
				} else {
					if err := rows.Scan(&tok, &now); err != nil {
						return err
					}
					if nowRaw != nil && !now.Equal(nows[j]) {
						return fmt.Errorf("pgstore: batch insert returned two statement times")
					}
					nows[j] = now
					if len(raw) == 2 {
						nowRaw = bytes.Clone(raw[1])
					}
				}
				k := int(tok % tokenScale)
				if base < 0 {
					base = tok / tokenScale
				}
				if tok < 0 || tok/tokenScale != base || lo+k >= hi || toks[lo+k] >= 0 {
					return fmt.Errorf("pgstore: batch insert returned an unexpected token %d", tok)
				}
				toks[lo+k] = tok
				n++
			}
			return rows.Err()
		})
		if err != nil {
			return false, err // one implicit transaction: nothing applied
		}
		// The statement succeeded: the inserted keys are acquired, settled
		// here as the caller's loop would settle them. A queue with more
		// entries keeps the record as rec (held now), and its later
		// entries are settled against it in Go; a queue of one entry needs
		// no row at all.
		var got []row
		for j, g := range sp {
			now := nows[j]
			for x := g.lo; x < g.hi; x++ {
				tok := toks[x]
				if tok < 0 {
					continue
				}
				kq := send[x]
				i := kq.idxs[kq.pos]
				req := &reqs[i]
				r := row{hash: kq.ref.hash, key: req.Key, state: stInProgress, token: tok, attempts: 1,
					lease:   now.Add(time.Duration(req.Lease.Microseconds()) * time.Microsecond),
					expires: now.Add(time.Duration(max(req.Lease.Microseconds(), req.TTL.Microseconds())) * time.Microsecond),
					created: now, updated: now, ttlUS: req.TTL.Microseconds(), now: now, acquired: true}
				if len(req.Fingerprint) > 0 {
					r.fp = bytes.Clone(req.Fingerprint)
				}
				out[i] = idem.BatchResult{Claim: idem.Claim{Outcome: idem.OutcomeAcquired, Record: r.record()}}
				kq.pos++ // settled: kq.got stays nil, so the caller's loop skips it
				if kq.pos < len(kq.idxs) {
					if got == nil {
						got = make([]row, 0, len(send)) // never grown: pointers stay valid
					}
					r.acquired = false // later entries see it as held
					got = append(got, r)
					kq.rec = &got[len(got)-1]
				}
			}
		}
		if n == len(send) {
			return true, nil
		}
		// The keys that already had a row go to the takeover statement.
		rest = make([]*keyQueue, 0, len(send)-n)
		for x, kq := range send {
			if toks[x] < 0 {
				rest = append(rest, kq)
			}
		}
		sp = spans(rest)
	}
	args, _ := s.batchArgs(reqs, rest, sp, false)
	// Rows are scanned into one slice with one reused target list: a
	// batch of 100 otherwise costs thousands of small allocations.
	got := make([]row, 0, len(rest))
	byHash := make(map[string]*row, len(rest))
	dst := make([]any, 0, 15)
	err = s.pipeline(ctx, q, sp, args, func(j int) string { return s.tables[rest[sp[j].lo].ref.table].batch }, func(_ int, rows pgx.Rows) error {
		for rows.Next() {
			if len(got) == cap(got) {
				return fmt.Errorf("pgstore: batch returned more rows than keys")
			}
			got = append(got, row{})
			r := &got[len(got)-1]
			if err := rows.Scan(r.targets(dst[:0], true)...); err != nil {
				return err
			}
			byHash[string(r.hash)] = r
		}
		return rows.Err()
	})
	if err != nil {
		return fast, err // the insert-only statement, if any, committed
	}
	for _, kq := range rest {
		kq.got = byHash[string(kq.ref.hash)]
	}
	return true, nil
}

// batchArgs builds the statement arguments of each span of send: $1 ns,
// then arrays of key hash, key, fingerprint, lease µs, TTL µs (and key
// time), each span's arrays slicing one backing array per column. With
// scalars, when every entry has the same lease and TTL (uniform), those
// two are passed as scalars (for the fastU statement).
func (s *Store) batchArgs(reqs []idem.ClaimRequest, send []*keyQueue, sp []span, scalars bool) (args [][]any, uniform bool) {
	n := len(send)
	hashes, keys, fps := make([][]byte, n), make([][]byte, n), make([][]byte, n)
	var times []time.Time
	if s.cfg.Layout.timed() {
		times = make([]time.Time, n)
	}
	first := &reqs[send[0].idxs[send[0].pos]]
	lease0, ttl0 := first.Lease.Microseconds(), first.TTL.Microseconds()
	anyFP, uniform := false, scalars
	for j, kq := range send {
		req := &reqs[kq.idxs[kq.pos]]
		hashes[j], keys[j], fps[j] = kq.ref.hash, req.Key, req.Fingerprint
		anyFP = anyFP || len(req.Fingerprint) > 0
		uniform = uniform && req.Lease.Microseconds() == lease0 && req.TTL.Microseconds() == ttl0
		if times != nil {
			times[j] = kq.ref.ktime
		}
	}
	var leases, ttls []int64
	if !uniform {
		leases, ttls = make([]int64, n), make([]int64, n)
		for j, kq := range send {
			req := &reqs[kq.idxs[kq.pos]]
			leases[j], ttls[j] = req.Lease.Microseconds(), req.TTL.Microseconds()
		}
	}
	args = make([][]any, len(sp))
	for j, g := range sp {
		lo, hi := g.lo, g.hi
		var fp byteaArray // NULL: unnest pads the column with NULLs, stored as ''
		if anyFP {
			fp = fps[lo:hi:hi]
		}
		a := []any{s.ns, byteaArray(hashes[lo:hi:hi]), byteaArray(keys[lo:hi:hi]), fp, lease0, ttl0}
		if !uniform {
			a[4], a[5] = leases[lo:hi:hi], ttls[lo:hi:hi]
		}
		if times != nil {
			a = append(a, timeArray(times[lo:hi:hi]))
		}
		args[j] = a
	}
	return args, uniform
}

// pipeline runs one statement per span (sql(j) with args[j]) in one round
// trip and hands each statement's rows to collect. Outside a caller's
// transaction the statements run in one implicit transaction (pgx sends
// one Sync for the batch): an error means none took effect.
func (s *Store) pipeline(ctx context.Context, q querier, sp []span, args [][]any, sql func(int) string, collect func(int, pgx.Rows) error) error {
	if len(sp) == 1 {
		rows, err := q.Query(ctx, sql(0), args[0]...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return collect(0, rows)
	}
	b := &pgx.Batch{}
	for j := range sp {
		b.Queue(sql(j), args[j]...)
	}
	br := q.SendBatch(ctx, b)
	for j := range sp {
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return err
		}
		err = collect(j, rows)
		rows.Close()
		if err != nil {
			_ = br.Close()
			return err
		}
	}
	return br.Close()
}

// CompleteBatch implements idem.BatchCompleter: one token-checked UPDATE
// per entry (the same statement as Complete), pipelined in one round trip.
// Each entry is judged on its own; an entry whose statement raced a
// concurrent change is settled with a follow-up Complete.
func (s *Store) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	return s.completeBatch(ctx, s.pool, cs, false)
}

func (s *Store) completeBatch(ctx context.Context, q querier, cs []idem.Completion, inTx bool) ([]error, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	errs := make([]error, len(cs))
	todo := make([]mutEntry, 0, len(cs))
	for i, c := range cs {
		if err := idem.ValidateResult(c.Result); err != nil {
			errs[i] = err
			continue
		}
		res := c.Result
		if res == nil {
			res = []byte{}
		}
		if e, err := s.mutEntry(i, c.Key, c.Token, res); err != nil {
			errs[i] = err
		} else {
			todo = append(todo, e)
		}
	}
	if err := s.mutateBatch(ctx, q, mutComplete, todo, errs, inTx); err != nil {
		return nil, err
	}
	return errs, nil
}

// ExtendBatch implements idem.BatchExtender as CompleteBatch does
// completions: one token-checked UPDATE per entry (Extend's statement),
// pipelined in one round trip on one connection. The guard's heartbeat
// sends the claims due in a tick this way: one Extend per claim starved a
// pool shared with the handler's own queries (a batch consumer holding
// ~2,000 keys).
func (s *Store) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	errs := make([]error, len(es))
	todo := make([]mutEntry, 0, len(es))
	for i, x := range es {
		if err := idem.ValidateLease(x.Lease); err != nil {
			errs[i] = err
			continue
		}
		if e, err := s.mutEntry(i, x.Key, x.Token, x.Lease.Microseconds()); err != nil {
			errs[i] = err
		} else {
			todo = append(todo, e)
		}
	}
	if err := s.mutateBatch(ctx, s.pool, mutExtend, todo, errs, false); err != nil {
		return nil, err
	}
	return errs, nil
}

// mutEntry is one entry of a batch of token-checked mutations: its index
// in the call, its key and token, and the mutation's argument.
type mutEntry struct {
	i     int
	ref   keyRef
	token uint64
	arg   any
	sort  sortKey
}

// mutEntry checks an entry's key and token as mutateTop does (tokenRef).
func (s *Store) mutEntry(i int, key []byte, token uint64, arg any) (mutEntry, error) {
	r, err := s.tokenRef(key, token)
	if err != nil {
		return mutEntry{}, err
	}
	return mutEntry{i: i, ref: r, token: token, arg: arg, sort: r.sortKey()}, nil
}

// mutateBatch sends mutation m of every entry of todo, pipelined in one
// round trip, and sets errs[e.i] from each answer. The statements go in
// index order, as ClaimBatch's rows do (then request order, so a key's
// entries apply in order): batches locking overlapping rows lock them in
// the same order and do not deadlock each other. An entry whose statement
// raced a concurrent change is settled with a follow-up statement of its
// own. A returned error: the call failed as a whole.
func (s *Store) mutateBatch(ctx context.Context, q querier, m mutation, todo []mutEntry, errs []error, inTx bool) error {
	if len(todo) == 0 {
		return nil
	}
	slices.SortStableFunc(todo, func(a, b mutEntry) int { return a.sort.compare(&b.sort) })
	b := &pgx.Batch{}
	for _, e := range todo {
		b.Queue(s.tables[e.ref.table].mut[m], s.args(e.ref, int64(e.token), e.arg, e.ref.key)...)
	}
	answers := make([]mutAnswer, len(todo))
	br := q.SendBatch(ctx, b)
	for j := range todo {
		a := &answers[j]
		if err := br.QueryRow().Scan(&a.done, &a.state, &a.cur, &a.key); err != nil {
			_ = br.Close()
			return s.mapErr(ctx, err, !inTx)
		}
	}
	if err := br.Close(); err != nil {
		return s.mapErr(ctx, err, !inTx)
	}
	for j, e := range todo {
		if errs[e.i] = answers[j].judge(m, e.ref, e.token); errs[e.i] == errSettle {
			// Our snapshot predates a concurrent change: ask again alone.
			errs[e.i] = s.mutate(ctx, q, m, e.ref, e.token, e.arg, inTx)
		}
		if errs[e.i] != nil && !errors.Is(errs[e.i], idem.ErrNotFound) && !errors.Is(errs[e.i], idem.ErrFenced) && !errors.Is(errs[e.i], idem.ErrCorrupt) {
			return errs[e.i] // the follow-up failed as a whole
		}
	}
	return nil
}

// byteaArray is a bytea[] parameter. pgx encodes a [][]byte through
// reflection, boxing every element; this hands out byteaElem values, which
// are pointer-shaped (boxing them does not allocate) and encode through
// pgtype.BytesValuer. A nil element is NULL, a nil array NULL.
type byteaArray [][]byte

func (a byteaArray) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

func (a byteaArray) Index(i int) any { return byteaElem{&a[i]} }

func (a byteaArray) IndexType() any { return byteaElem{} }

type byteaElem struct{ p *[]byte }

func (e byteaElem) BytesValue() ([]byte, error) {
	if e.p == nil {
		return nil, nil
	}
	return *e.p, nil
}

// timeArray is a timestamptz[] parameter, encoded like byteaArray.
type timeArray []time.Time

func (a timeArray) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

func (a timeArray) Index(i int) any { return timeElem{&a[i]} }

func (a timeArray) IndexType() any { return timeElem{} }

type timeElem struct{ p *time.Time }

func (e timeElem) TimestamptzValue() (pgtype.Timestamptz, error) {
	if e.p == nil {
		return pgtype.Timestamptz{}, nil
	}
	return pgtype.Timestamptz{Time: *e.p, Valid: true}, nil
}
