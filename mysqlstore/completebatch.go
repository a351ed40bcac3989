package mysqlstore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/idem-dev/idem"
)

var (
	_ idem.BatchCompleter = (*Store)(nil)
	_ idem.BatchExtender  = (*Store)(nil)
)

// maxCompleteSQL bounds one CompleteBatch statement (results are sent as
// hex, up to 2 MiB each) well under the default max_allowed_packet (16 MiB).
const maxCompleteSQL = 8 << 20

// batchEntry is one distinct (key, token) of a CompleteBatch or
// ExtendBatch call.
type batchEntry struct {
	key    []byte
	token  uint64
	result []byte // CompleteBatch's
	lease  int64  // ExtendBatch's, µs
	l      loc
	err    error // the verdict, once the statement ran
}

// CompleteBatch implements idem.BatchCompleter. Each entry is validated
// first (an invalid one gets its own error and sends nothing). The valid
// ones go into one multi-table UPDATE per table (per shard in
// LayoutSharded, run in parallel) and per MaxBatch rows: a derived table of
// (key_hash, token, position) rows, sorted by primary key, drives a join onto
// the records, and each record is updated with Complete's own SET clause
// and condition (finishCond). It runs in autocommit: one round trip. When
// it changed as many rows as it carried entries, every entry applied;
// otherwise one read of those keys judges each entry as Complete does
// (idempotent repeat, ErrFenced, ErrNotFound).
//
// Duplicate keys are answered as sequential Completes would be: only the
// first entry of each (key, token) is sent (a repeat with the same token is
// an idempotent nil and never overwrites the first result); entries with
// other tokens of the same key are sent too and cannot match the record
// once one token has, so each is judged from the record the batch left.
//
// A returned error means the call failed as a whole (errs is nil): a
// statement was refused (ErrUnavailable), or some statements may have
// applied (ErrUnknownOutcome). Completing again with the same token is
// idempotent, so the caller can retry.
func (s *Store) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	return s.tokenBatch(ctx, false, len(cs), func(i int) (batchEntry, error) {
		c := &cs[i]
		if err := idem.ValidateToken(c.Key, c.Token); err != nil {
			return batchEntry{}, err
		}
		return batchEntry{key: c.Key, token: c.Token, result: c.Result}, idem.ValidateResult(c.Result)
	})
}

// ExtendBatch implements idem.BatchExtender as CompleteBatch does
// completions: one multi-table UPDATE per table and MaxBatch rows, the
// derived table carrying each entry's lease, with Extend's SET clause and
// condition; one read judges the entries when fewer rows changed than
// entries were sent. Of several entries with the same key and token only
// one is sent, with the last entry's lease (sequential Extends leave the
// last lease; within one statement they would all read the same clock),
// and they share its verdict. The guard's heartbeat sends the claims due in
// a tick this way instead of one statement (and connection) per claim.
func (s *Store) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	return s.tokenBatch(ctx, true, len(es), func(i int) (batchEntry, error) {
		x := &es[i]
		if err := idem.ValidateToken(x.Key, x.Token); err != nil {
			return batchEntry{}, err
		}
		return batchEntry{key: x.Key, token: x.Token, lease: x.Lease.Microseconds()}, idem.ValidateLease(x.Lease)
	})
}

// tokenBatch runs CompleteBatch (extend false) or ExtendBatch over n
// entries; entry(i) returns entry i, or its validation error.
func (s *Store) tokenBatch(ctx context.Context, extend bool, n int, entry func(i int) (batchEntry, error)) ([]error, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	errs := make([]error, n)
	type pair struct {
		key   string
		token uint64
	}
	ref := make([]*batchEntry, n)
	seen := map[pair]*batchEntry{}
	var todo []*batchEntry
	for i := range n {
		e, err := entry(i)
		if errs[i] = err; err != nil {
			continue
		}
		l, err := s.locate(e.key)
		if err != nil {
			errs[i] = err
			continue
		}
		p := pair{string(e.key), e.token}
		if ref[i] = seen[p]; ref[i] == nil {
			e.l = l
			ref[i] = &e
			seen[p] = ref[i]
			todo = append(todo, ref[i])
		} else if extend {
			ref[i].lease = e.lease
		}
	}
	if len(todo) == 0 {
		return errs, nil
	}
	if err := s.updateAll(ctx, todo, extend); err != nil {
		return nil, err
	}
	for i, e := range ref {
		if e != nil {
			errs[i] = e.err
		}
	}
	return errs, nil
}

// updateAll splits todo into statements (per table, sorted by primary
// key so concurrent batches lock rows in the same order, at most MaxBatch
// rows and maxCompleteSQL bytes each) and runs them, in parallel when there
// are several.
func (s *Store) updateAll(ctx context.Context, todo []*batchEntry, extend bool) error {
	slices.SortFunc(todo, func(a, b *batchEntry) int {
		return cmp.Or(strings.Compare(a.l.table, b.l.table), cmp.Compare(a.l.kt, b.l.kt),
			bytes.Compare(a.l.hash[:], b.l.hash[:]), cmp.Compare(a.token, b.token))
	})
	var chunks [][]*batchEntry
	start, size := 0, 0
	for i, c := range todo {
		n := 2*len(c.result) + 200
		if i > start && (c.l.table != todo[start].l.table || i-start >= s.cfg.MaxBatch || size+n > maxCompleteSQL) {
			chunks = append(chunks, todo[start:i])
			start, size = i, 0
		}
		size += n
	}
	chunks = append(chunks, todo[start:])
	errs := make([]error, len(chunks))
	if len(chunks) == 1 {
		errs[0] = s.runChunk(ctx, chunks[0], extend)
	} else {
		var wg sync.WaitGroup
		for i := range chunks {
			wg.Go(func() { errs[i] = s.runChunk(ctx, chunks[i], extend) })
		}
		wg.Wait()
	}
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			first = cmp.Or(first, err)
		}
	}
	if first != nil && failed < len(chunks) && !errors.Is(first, idem.ErrUnknownOutcome) {
		return fmt.Errorf("%w: mysqlstore: %d of %d %s statements failed: %w", idem.ErrUnknownOutcome, failed, len(chunks), opName(extend), first)
	}
	return first
}

// op is the entry's operation as Complete (extend false) or Extend runs it.
func (e *batchEntry) op(extend bool) finishOp {
	if extend {
		return extendOp(e.lease)
	}
	return completeOp(e.result)
}

func opName(extend bool) string {
	if extend {
		return "extend"
	}
	return "complete"
}

// batchSQL builds the UPDATE for one chunk (one table): Complete's (or
// Extend's) SET clause and condition, with the token taken from the
// derived table v and the result chosen by the entry's position in it (or
// the lease taken from it).
func (s *Store) batchSQL(chunk []*batchEntry, extend bool) string {
	timed := s.cfg.Layout.timed()
	var sb strings.Builder
	size := 512
	for _, c := range chunk {
		size += 2*len(c.result) + 100
	}
	sb.Grow(size)
	// STRAIGHT_JOIN: the derived table drives, so each entry is one primary
	// key lookup (never a scan of the records), in the sorted order.
	sb.WriteString("UPDATE (")
	for i, c := range chunk {
		// Column names come from the first SELECT of the UNION.
		as := func(name string) {
			if i == 0 {
				sb.WriteString(" AS " + name)
			}
		}
		if i > 0 {
			sb.WriteString(" UNION ALL ")
		}
		sb.WriteString("SELECT ")
		hexLit(&sb, c.l.hash[:])
		as("bh")
		sb.WriteByte(',')
		uintLit(&sb, c.token)
		as("bt")
		sb.WriteByte(',')
		if extend {
			intLit(&sb, c.lease)
			as("bl")
		} else {
			intLit(&sb, int64(i+1))
			as("bi")
		}
		if timed {
			sb.WriteByte(',')
			intLit(&sb, c.l.kt)
			as("bkt")
		}
	}
	sb.WriteString(") AS v STRAIGHT_JOIN ")
	sb.WriteString(chunk[0].l.table)
	sb.WriteString(forcePK + " ON ")
	if timed {
		sb.WriteString("key_time = v.bkt AND ")
	}
	sb.WriteString("key_hash = v.bh SET ")
	if extend {
		extendOpWith(func(sb *strings.Builder) { sb.WriteString("v.bl") }).set(&sb)
	} else {
		// The results stay out of the derived table: MariaDB 10.11 silently
		// truncates a UNION column of binary literals longer than 64 KiB (to
		// the length mod 65536). ELT picks the entry's literal by position.
		completeOpWith(func(sb *strings.Builder) {
			sb.WriteString("ELT(v.bi")
			for _, c := range chunk {
				sb.WriteByte(',')
				if len(c.result) == 0 {
					sb.WriteString("NULL")
				} else {
					hexLit(sb, c.result)
				}
			}
			sb.WriteByte(')')
		}).set(&sb)
	}
	sb.WriteString(", updated_at = " + nowUS + " WHERE ns = ")
	sb.WriteString(s.nsLit)
	finishCond(&sb, func(sb *strings.Builder) { sb.WriteString("v.bt") })
	return sb.String()
}

// runChunk runs one chunk's UPDATE in autocommit (deadlocks retried:
// the statement was rolled back) and, unless it changed a row for every
// entry, reads the chunk's records once to judge each entry.
func (s *Store) runChunk(ctx context.Context, chunk []*batchEntry, extend bool) error {
	query := s.batchSQL(chunk, extend)
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var n int64
	err = s.retry(ctx, true, func() error {
		res, err := c.ExecContext(ctx, query)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return mapErr(err, true)
	}
	if n == int64(len(chunk)) {
		return nil // every entry matched a live record with its token
	}
	if err := s.judgeChunk(ctx, c, chunk, extend); err != nil {
		return fmt.Errorf("%w: mysqlstore: %d of %d %s entries applied, then: %w", idem.ErrUnknownOutcome, n, len(chunk), opName(extend), err)
	}
	return nil
}

// judgeChunk reads the live records of a chunk's keys and sets each
// entry's verdict as finish does after an UPDATE that changed nothing.
func (s *Store) judgeChunk(ctx context.Context, q querier, chunk []*batchEntry, extend bool) error {
	var sb strings.Builder
	sb.WriteString("SELECT key_hash, k, state, token FROM ")
	sb.WriteString(chunk[0].l.table)
	sb.WriteString(" WHERE (")
	for i, c := range chunk {
		if i > 0 {
			sb.WriteString(" OR ")
		}
		sb.WriteByte('(')
		s.pk(&sb, c.l)
		sb.WriteByte(')')
	}
	sb.WriteString(") AND expires_at > " + nowUS)
	type live struct {
		k     []byte
		state int
		token uint64
	}
	found := map[[16]byte]live{}
	rows, err := q.QueryContext(ctx, sb.String())
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var h []byte
		var r live
		if err := rows.Scan(&h, &r.k, &r.state, &r.token); err != nil {
			return err
		}
		found[[16]byte(h)] = r
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, c := range chunk {
		r, ok := found[c.l.hash]
		switch {
		case !ok || !bytes.Equal(r.k, c.key):
			c.err = fmt.Errorf("%w: key %q", idem.ErrNotFound, truncKey(c.key))
		case checkStored(c.key, r.state, r.token) != nil:
			c.err = checkStored(c.key, r.state, r.token)
		case r.token == c.token && r.state == stInProgress:
			// Not expected (the UPDATE would have matched it); settle this
			// entry alone rather than guess.
			c.err = s.finish(ctx, q, c.key, c.token, c.op(extend))
			if c.err != nil && !errors.Is(c.err, idem.ErrFenced) && !errors.Is(c.err, idem.ErrNotFound) {
				return c.err
			}
		default:
			c.err = c.op(extend).verdict(c.key, c.token, idem.State(r.state), r.token)
		}
	}
	return nil
}
