package mysqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
)

// Record states as stored in the state column (the idem.State values).
const (
	stInProgress = int(idem.StateInProgress)
	stCompleted  = int(idem.StateCompleted)
	stFailed     = int(idem.StateFailed)
	stReleased   = int(idem.StateReleased)
)

// Store is an idem.Store on a MariaDB/MySQL table. It also implements
// idem.BatchClaimer, BatchCompleter, Purger, Lister, Stater and Pinger, and
// the transactional ClaimTx / CompleteTx / DoTx.
type Store struct {
	cfg    Config
	db     *sql.DB
	n      names
	ns     []byte
	nsLit  string
	closed atomic.Bool
	// ownDB: the Store made its pool (URLConfig.Open) and closes it.
	ownDB bool
	// derivedMin is the smallest claim statement (in rows) whose rows are
	// sent as a derived table (see claimSQL); tests lower it to 1.
	derivedMin int
}

// defaultDerivedMin: from this many rows on, a claim statement takes its
// rows from a derived table instead of a VALUES list. Measured with SHOW
// PROFILE on MariaDB 10.11: a 100-row VALUES list with the clock and
// NEXTVAL expressions in every row spends about 1 ms more in parsing than
// the derived table does, while one row costs about 0.2 ms more as a
// derived table (docs/benchmarks/mysqlstore.md).
const defaultDerivedMin = 16

var (
	_ idem.Store           = (*Store)(nil)
	_ idem.BatchClaimer    = (*Store)(nil)
	_ idem.Purger          = (*Store)(nil)
	_ idem.Lister          = (*Store)(nil)
	_ idem.Stater          = (*Store)(nil)
	_ idem.Pinger          = (*Store)(nil)
	_ idem.ErrorClassifier = (*Store)(nil)
)

// Open validates cfg, checks that the schema was migrated for it, and
// returns a Store. It does not create tables: call Migrate first (or run the
// mysqlstore-migrate command).
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctxErr(ctx); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	s := &Store{cfg: c, db: c.DB, n: namesOf(c), ns: []byte(c.Namespace), nsLit: hexStr([]byte(c.Namespace)), derivedMin: defaultDerivedMin}
	if err := checkSchema(ctx, c, s.n); err != nil {
		return nil, err
	}
	return s, nil
}

// Close marks the store closed; later calls return idem.ErrClosed. The
// *sql.DB belongs to the caller and stays open, unless the Store made it
// (URLConfig.Open).
func (s *Store) Close() error {
	if !s.closed.Swap(true) && s.ownDB {
		return s.db.Close()
	}
	return nil
}

func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return idem.ErrClosed
	}
	return ctxErr(ctx)
}

// loc is where a key lives: its table and primary-key values.
type loc struct {
	table string
	hash  [16]byte
	kt    int64 // key_time, timed layouts only
}

func (s *Store) locate(key []byte) (loc, error) {
	if err := idem.ValidateKey(key); err != nil {
		return loc{}, err
	}
	l := loc{hash: keyHash(key)}
	if s.cfg.Layout.timed() {
		t, err := s.cfg.KeyTime(key)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				err = fmt.Errorf("%w: %w", idem.ErrInvalidKey, err)
			}
			return loc{}, err
		}
		l.kt = t.UnixMicro()
	}
	if s.cfg.Layout == LayoutSharded {
		l.table = s.n.tables[binary.BigEndian.Uint32(l.hash[:4])%uint32(len(s.n.tables))]
	} else {
		l.table = s.n.tables[0]
	}
	return l, nil
}

// forcePK follows the table name in every statement that addresses one
// record by its primary key. The WHERE clauses also say "state = 1 AND
// expires_at > now", which the (ns, state, expires_at) index could serve,
// and MariaDB has been seen to pick that index for a token operation's
// UPDATE (its statistics on a small or just reorganized partition): the
// UPDATE then locks the clustered row of every live in-progress record of
// the namespace it reads, in a transaction until the commit, and deadlocks
// with Purge (TestMaintenanceFromAnotherProcess caught it).
const forcePK = " FORCE INDEX (PRIMARY)"

// pk writes the primary-key predicate: plain column equalities, so the
// lookup is one index dive (never CONCAT or a function on a column).
func (s *Store) pk(sb *strings.Builder, l loc) {
	sb.WriteString("ns = ")
	sb.WriteString(s.nsLit)
	if s.cfg.Layout.timed() {
		sb.WriteString(" AND key_time = ")
		intLit(sb, l.kt)
	}
	sb.WriteString(" AND key_hash = ")
	hexLit(sb, l.hash[:])
}

type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

const recCols = "k, state, token, nonce, fp, result, attempts, last_error, lease_until, expires_at, created_at, updated_at"

type row struct {
	rec   idem.Record
	nonce uint64
	bad   error // the stored values are not a record (idem.ErrCorrupt)
}

// checkStored reports a stored state or token no operation of the store
// writes (a row damaged by hand, by a bug, by a restore of another
// version) as idem.ErrCorrupt naming the key: an error of that key alone,
// never a record served or taken over.
func checkStored(key []byte, state int, token uint64) error {
	if state < stInProgress || state > stReleased || token == 0 {
		return fmt.Errorf("%w: mysqlstore: key %q has state %d, token %d", idem.ErrCorrupt, truncKey(key), state, token)
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scanRow(sc scanner, extra ...any) (row, error) {
	var (
		r                            row
		state                        int
		result                       []byte
		lastErr                      []byte
		lease, exp, created, updated int64
		attempts                     int64
	)
	if err := sc.Scan(append([]any{&r.rec.Key, &state, &r.rec.Token, &r.nonce, &r.rec.Fingerprint, &result, &attempts, &lastErr, &lease, &exp, &created, &updated}, extra...)...); err != nil {
		return row{}, err
	}
	r.rec.State = idem.State(state)
	r.bad = checkStored(r.rec.Key, state, r.rec.Token)
	if len(result) > 0 {
		r.rec.Result = result
	}
	if len(r.rec.Fingerprint) == 0 {
		r.rec.Fingerprint = nil
	}
	r.rec.Attempts = int(attempts)
	r.rec.LastError = string(lastErr)
	r.rec.LeaseUntil = time.UnixMicro(lease).UTC()
	r.rec.ExpiresAt = time.UnixMicro(exp).UTC()
	r.rec.CreatedAt = time.UnixMicro(created).UTC()
	r.rec.UpdatedAt = time.UnixMicro(updated).UTC()
	return r, nil
}

var errCollision = errors.New("mysqlstore: key hash collision (two keys share SHA-256[:16]); refusing to serve the other key's record")

// ---- claims ----

// item is one key of a claim statement.
type item struct {
	idx   int // position in the caller's batch
	req   idem.ClaimRequest
	l     loc
	nonce uint64
	// filled by the statement
	got      row
	ok       bool
	acquired bool
}

// claimSQL builds one INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING for
// items that share a table. The whole claim decision happens inside the
// statement under the row lock: a new key is inserted; an existing row is
// taken over only when the IF() conditions on its current values say so
// (expired record, released, or in progress with a lapsed lease and no
// fingerprint conflict). RETURNING gives back every row as it stands after
// the statement, so the caller learns each outcome without a second read.
func (s *Store) claimSQL(table string, items []*item, ignore bool) string {
	var sb strings.Builder
	sb.Grow(256 + len(items)*(400+2*idem.MaxKeyLen))
	if s.cfg.LockWait > 0 {
		secs := int64((s.cfg.LockWait + time.Second - 1) / time.Second)
		sb.WriteString("SET STATEMENT innodb_lock_wait_timeout = ")
		intLit(&sb, secs)
		sb.WriteString(" FOR ")
	}
	if ignore {
		sb.WriteString("INSERT IGNORE INTO ")
	} else {
		sb.WriteString("INSERT INTO ")
	}
	sb.WriteString(table)
	sb.WriteString(" (ns, ")
	if s.cfg.Layout.timed() {
		sb.WriteString("key_time, ")
	}
	sb.WriteString("key_hash, k, state, token, nonce, fp, result, attempts, last_error, ttl_us, lease_until, expires_at, created_at, updated_at) ")
	if len(items) >= s.derivedMin {
		s.derivedRows(&sb, items)
	} else {
		s.valuesRows(&sb, items)
	}
	if ignore {
		// Only rows this statement inserted come back, with the values it
		// wrote: everything but the token and the clock is the request's
		// (see insertedRow).
		sb.WriteString(" RETURNING k, token, updated_at")
		return sb.String()
	}
	// ON DUPLICATE KEY UPDATE assigns left to right and later assignments
	// see earlier ones, so the decision is taken once, on the old values,
	// into @idem_take / @idem_fresh, and every column follows it.
	// VALUES(updated_at) is the statement's now.
	sb.WriteString(` ON DUPLICATE KEY UPDATE
 updated_at = IF(@idem_take := ((@idem_fresh := (expires_at <= VALUES(updated_at)))
    OR ((state = 4 OR (state = 1 AND lease_until <= VALUES(updated_at)))
        AND NOT (fp <> '' AND VALUES(fp) <> '' AND fp <> VALUES(fp)))), VALUES(updated_at), updated_at),
 token = IF(@idem_take, NEXTVAL(`)
	sb.WriteString(s.n.seq)
	sb.WriteString(`), token),
 nonce = IF(@idem_take, VALUES(nonce), nonce),
 attempts = IF(@idem_take, IF(@idem_fresh, 1, attempts + 1), attempts),
 fp = IF(@idem_fresh OR (@idem_take AND fp = ''), VALUES(fp), fp),
 result = IF(@idem_fresh, NULL, result),
 last_error = IF(@idem_fresh, '', last_error),
 created_at = IF(@idem_fresh, VALUES(created_at), created_at),
 ttl_us = IF(@idem_take, VALUES(ttl_us), ttl_us),
 lease_until = IF(@idem_take, VALUES(lease_until), lease_until),
 expires_at = IF(@idem_take, VALUES(expires_at), expires_at),
 state = IF(@idem_take, 1, state)
RETURNING ` + recCols)
	return sb.String()
}

// valuesRows writes the rows of a claim statement as a VALUES list: every
// row carries its own NEXTVAL and clock expressions.
func (s *Store) valuesRows(sb *strings.Builder, items []*item) {
	sb.WriteString("VALUES ")
	for i, it := range items {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteByte('(')
		sb.WriteString(s.nsLit)
		sb.WriteByte(',')
		if s.cfg.Layout.timed() {
			intLit(sb, it.l.kt)
			sb.WriteByte(',')
		}
		hexLit(sb, it.l.hash[:])
		sb.WriteByte(',')
		hexLit(sb, it.req.Key)
		sb.WriteString(",1,NEXTVAL(")
		sb.WriteString(s.n.seq)
		sb.WriteString("),")
		uintLit(sb, it.nonce)
		sb.WriteByte(',')
		hexLit(sb, it.req.Fingerprint)
		sb.WriteString(",NULL,1,'',")
		lease := it.req.Lease.Microseconds()
		ttl := it.req.TTL.Microseconds()
		intLit(sb, ttl)
		sb.WriteByte(',')
		sb.WriteString(nowUS)
		sb.WriteByte('+')
		intLit(sb, lease)
		sb.WriteByte(',')
		sb.WriteString(nowUS)
		sb.WriteByte('+')
		intLit(sb, max(ttl, lease))
		sb.WriteByte(',')
		sb.WriteString(nowUS)
		sb.WriteByte(',')
		sb.WriteString(nowUS)
		sb.WriteByte(')')
	}
}

// derivedRows writes the rows of a claim statement as INSERT ... SELECT
// from a derived table: only the per-key literals go into the VALUES list
// of a CTE, and NEXTVAL and the database clock appear once in the SELECT
// list (evaluated per row, parsed once). For a 100-row batch this halves
// the server's parse time; the statement is otherwise the same (same
// columns, values, ON DUPLICATE KEY UPDATE and RETURNING), and the rows are
// read from the CTE in the order written (sorted by primary key). The
// clock comes from a one-row derived table, so every row of the statement
// sees the same instant, as UTC_TIMESTAMP guarantees anyway. The join has
// an explicit ON TRUE: without it the parser would take a following "ON
// DUPLICATE KEY UPDATE" for the join condition.
func (s *Store) derivedRows(sb *strings.Builder, items []*item) {
	timed := s.cfg.Layout.timed()
	sb.WriteString("WITH idem_v (")
	if timed {
		sb.WriteString("v_kt, ")
	}
	sb.WriteString("v_hash, v_k, v_nonce, v_fp, v_ttl, v_lease, v_life) AS (VALUES ")
	for i, it := range items {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteByte('(')
		if timed {
			intLit(sb, it.l.kt)
			sb.WriteByte(',')
		}
		hexLit(sb, it.l.hash[:])
		sb.WriteByte(',')
		hexLit(sb, it.req.Key)
		sb.WriteByte(',')
		uintLit(sb, it.nonce)
		sb.WriteByte(',')
		hexLit(sb, it.req.Fingerprint)
		sb.WriteByte(',')
		lease := it.req.Lease.Microseconds()
		ttl := it.req.TTL.Microseconds()
		intLit(sb, ttl)
		sb.WriteByte(',')
		intLit(sb, lease)
		sb.WriteByte(',')
		intLit(sb, max(ttl, lease))
		sb.WriteByte(')')
	}
	sb.WriteString(") SELECT ")
	sb.WriteString(s.nsLit)
	if timed {
		sb.WriteString(", v_kt")
	}
	sb.WriteString(", v_hash, v_k, 1, NEXTVAL(")
	sb.WriteString(s.n.seq)
	sb.WriteString("), v_nonce, v_fp, NULL, 1, '', v_ttl, idem_now.t + v_lease, idem_now.t + v_life, idem_now.t, idem_now.t FROM idem_v JOIN (SELECT " + nowUS + " AS t) idem_now ON TRUE")
}

// execClaims runs one claim statement and matches the returned rows to
// items by raw key (unique within a statement).
func (s *Store) execClaims(ctx context.Context, q querier, table string, items []*item, ignore bool) error {
	query := s.claimSQL(table, items, ignore)
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	byKey := make(map[string]*item, len(items))
	for _, it := range items {
		byKey[string(it.req.Key)] = it
	}
	for rows.Next() {
		var r row
		if ignore {
			r, err = insertedRow(rows, byKey)
		} else {
			r, err = scanRow(rows)
		}
		if err != nil {
			return err
		}
		it := byKey[string(r.rec.Key)]
		if it == nil {
			return errCollision
		}
		it.got, it.ok = r, true
		it.acquired = r.bad == nil && r.nonce == it.nonce && r.rec.State == idem.StateInProgress
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if ignore {
		return nil // keys not returned already had a row: phase 2
	}
	for _, it := range items {
		if !it.ok {
			return errCollision // a row came back under another key
		}
	}
	return nil
}

// insertedRow reads a row returned by the first phase's INSERT IGNORE ...
// RETURNING k, token, updated_at. Such a row was inserted by that statement
// from the item's values, so the record is rebuilt from them: in progress,
// the drawn token, the item's nonce and fingerprint, no result, attempt 1,
// and the times the statement computed from its clock (the same
// expressions as in claimSQL). 3 columns instead of 12 per new key: less
// for the server to send and for the driver to parse and convert.
func insertedRow(sc scanner, byKey map[string]*item) (row, error) {
	var (
		k     []byte
		token uint64
		now   int64
	)
	if err := sc.Scan(&k, &token, &now); err != nil {
		return row{}, err
	}
	it := byKey[string(k)]
	if it == nil {
		return row{}, errCollision
	}
	lease := it.req.Lease.Microseconds()
	ttl := it.req.TTL.Microseconds()
	r := row{nonce: it.nonce, rec: idem.Record{
		Key:        k,
		State:      idem.StateInProgress,
		Token:      token,
		Attempts:   1,
		LeaseUntil: time.UnixMicro(now + lease).UTC(),
		ExpiresAt:  time.UnixMicro(now + max(ttl, lease)).UTC(),
		CreatedAt:  time.UnixMicro(now).UTC(),
		UpdatedAt:  time.UnixMicro(now).UTC(),
	}}
	if len(it.req.Fingerprint) > 0 {
		r.rec.Fingerprint = bytes.Clone(it.req.Fingerprint)
	}
	return r, nil
}

// claimChunk claims items of one table. Unless Config.SingleStatement is
// set it goes in two phases: INSERT IGNORE ... RETURNING creates every key
// that has no row and returns exactly those (acquired, one round trip: the
// common case of a first delivery); only keys that already had a row
// (duplicates, released or expired records) go to the full INSERT ... ON
// DUPLICATE KEY UPDATE ... RETURNING. Each key's claim is still decided by
// one atomic statement; the first one's "ignored" only routes the key to
// the second, which re-decides on the row as it then stands (absent again:
// insert). Measured on MariaDB 10.11, ON DUPLICATE KEY UPDATE costs about
// twice a plain insert even for new keys (docs/benchmarks/mysqlstore.md).
//
// Inside a caller's transaction the single statement is always used: there
// the first phase's duplicate check would leave a shared lock on an existing
// row until commit, and two transactions upgrading their shared locks to
// exclusive in phase 2 would deadlock on every concurrent duplicate.
func (s *Store) claimChunk(ctx context.Context, q querier, table string, items []*item, inTx bool) error {
	if s.cfg.SingleStatement || inTx {
		return s.retry(ctx, !inTx, func() error { return s.execClaims(ctx, q, table, items, false) })
	}
	if err := s.retry(ctx, !inTx, func() error { return s.execClaims(ctx, q, table, items, true) }); err != nil {
		return err
	}
	var rest []*item
	for _, it := range items {
		if !it.ok {
			rest = append(rest, it)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	err := s.retry(ctx, !inTx, func() error { return s.execClaims(ctx, q, table, rest, false) })
	if err != nil && !inTx && len(rest) < len(items) {
		// Some keys of this chunk were acquired by the first statement.
		return fmt.Errorf("%w: mysqlstore: %d of %d keys claimed, then: %w", idem.ErrUnknownOutcome, len(items)-len(rest), len(items), mapErr(err, true))
	}
	return err
}

func fpConflict(stored, req []byte) bool {
	return len(stored) > 0 && len(req) > 0 && !bytes.Equal(stored, req)
}

// outcome turns a returned row into the claim result for req.
func outcome(r row, acquired bool, req idem.ClaimRequest) (idem.Claim, error) {
	rec := r.rec
	if r.bad != nil {
		return idem.Claim{}, r.bad
	}
	if acquired {
		return idem.Claim{Outcome: idem.OutcomeAcquired, Record: rec}, nil
	}
	if fpConflict(rec.Fingerprint, req.Fingerprint) {
		return idem.Claim{}, fmt.Errorf("%w: key %q", idem.ErrFingerprintMismatch, truncKey(req.Key))
	}
	switch rec.State {
	case idem.StateCompleted:
		return idem.Claim{Outcome: idem.OutcomeCompleted, Record: rec}, nil
	case idem.StateFailed:
		return idem.Claim{Outcome: idem.OutcomeFailed, Record: rec}, nil
	case idem.StateInProgress:
		return idem.Claim{Outcome: idem.OutcomeInProgress, Record: rec}, nil
	}
	return idem.Claim{}, fmt.Errorf("%w: mysqlstore: claim left key %q in state %s", idem.ErrUnknownOutcome, truncKey(req.Key), rec.State)
}

func truncKey(k []byte) []byte {
	if len(k) > 64 {
		return k[:64]
	}
	return k
}

func newNonce() uint64 { return rand.Uint64() | 1 }

// Claim implements idem.Store: one atomic statement in autocommit (see
// claimChunk); one round trip for a new key, two for a key that already has
// a record. Deadlocks (1213) are retried.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	l, err := s.prepareClaim(ctx, req)
	if err != nil {
		return idem.Claim{}, err
	}
	c, err := s.conn(ctx)
	if err != nil {
		return idem.Claim{}, err
	}
	defer c.Close()
	return s.claimOne(ctx, c, req, l, true)
}

// prepareClaim validates req, locates its row and checks the store is open
// and ctx live: everything before the first SQL of Claim and ClaimTx.
func (s *Store) prepareClaim(ctx context.Context, req idem.ClaimRequest) (loc, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return loc{}, err
	}
	l, err := s.locate(req.Key)
	if err != nil {
		return loc{}, err
	}
	return l, s.check(ctx)
}

func (s *Store) claimOne(ctx context.Context, q querier, req idem.ClaimRequest, l loc, retry bool) (idem.Claim, error) {
	it := &item{req: req, l: l, nonce: newNonce()}
	err := s.claimChunk(ctx, q, l.table, []*item{it}, !retry)
	if err != nil {
		return idem.Claim{}, s.claimErr(req.Key, err)
	}
	return outcome(it.got, it.acquired, req)
}

// claimErr maps a failed claim statement. A lock wait timeout means a
// transaction (DoTx) is working on the key right now: report it in progress.
func (s *Store) claimErr(key []byte, err error) error {
	if errors.Is(err, errCollision) {
		return err
	}
	if isServerErr(err, erLockWaitTimeout) {
		return &lockWaitError{in: idem.InProgressError{Key: key, LeaseUntil: time.Now().Add(time.Second)}, err: err}
	}
	return mapErr(err, true)
}

// lockWaitError is an idem.InProgressError that also unwraps to the driver
// error (1205).
type lockWaitError struct {
	in  idem.InProgressError
	err error
}

func (e *lockWaitError) Error() string                     { return e.in.Error() + " (row locked by another transaction)" }
func (e *lockWaitError) Is(target error) bool              { return target == idem.ErrInProgress }
func (e *lockWaitError) Unwrap() error                     { return e.err }
func (e *lockWaitError) InProgress() *idem.InProgressError { return &e.in }

// retry runs fn, again after a deadlock (the statement was rolled back, so
// nothing was applied), at most TxRetries more times.
func (s *Store) retry(ctx context.Context, enabled bool, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || !enabled || !IsRetryable(err) || attempt >= s.cfg.TxRetries {
			return err
		}
		s.cfg.Logger.DebugContext(ctx, "mysqlstore: deadlock, retrying", "attempt", attempt+1)
		t := time.NewTimer(time.Duration(1+rand.IntN(5<<attempt)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// ClaimBatch implements idem.BatchClaimer. Distinct keys go into one
// multi-row statement per table (per shard in LayoutSharded, run in
// parallel) and per MaxBatch rows (see claimChunk): for the single,
// time-ordered and partitioned layouts a batch of up to MaxBatch new keys
// is one statement and one round trip. Rows are sorted by primary key so
// concurrent batches lock in the same order (fewer deadlocks).
//
// A key that appears again later in the batch is answered as claiming it
// again right after its previous entry would be: from the row the statement
// returned (in progress, completed, failed, or a fingerprint mismatch). Only
// an entry following a mismatch, whose own fingerprint might take the key
// over, needs another statement.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	return s.claimBatch(ctx, nil, reqs)
}

// claimBatch runs on tx when it is not nil, else on the pool.
func (s *Store) claimBatch(ctx context.Context, tx *sql.Tx, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	out := make([]idem.BatchResult, len(reqs))
	type keyState struct {
		occ  []int
		next int
		last *item // last entry sent to SQL for the key
		lerr error // its error (mismatch) if any
	}
	keys := map[string]*keyState{}
	var order []*keyState
	items := make([]*item, len(reqs))
	for i, r := range reqs {
		if err := idem.ValidateClaim(r); err != nil {
			out[i].Err = err
			continue
		}
		l, err := s.locate(r.Key)
		if err != nil {
			out[i].Err = err
			continue
		}
		items[i] = &item{idx: i, req: r, l: l}
		ks := keys[string(r.Key)]
		if ks == nil {
			ks = &keyState{}
			keys[string(r.Key)] = ks
			order = append(order, ks)
		}
		ks.occ = append(ks.occ, i)
	}
	applied := false
	for {
		var round []*item
		for _, ks := range order {
			for ks.next < len(ks.occ) {
				it := items[ks.occ[ks.next]]
				if ks.last == nil || errors.Is(ks.lerr, idem.ErrFingerprintMismatch) {
					it.nonce = newNonce()
					round = append(round, it)
					break
				}
				// Derived: the previous entry left the record as ks.last.got.
				out[it.idx].Claim, out[it.idx].Err = outcome(ks.last.got, false, it.req)
				ks.next++
			}
		}
		if len(round) == 0 {
			return out, nil
		}
		if err := s.runRound(ctx, tx, round); err != nil {
			if applied {
				err = fmt.Errorf("%w: mysqlstore: batch partly applied: %w", idem.ErrUnknownOutcome, err)
			}
			return nil, err
		}
		applied = true
		for _, it := range round {
			ks := keys[string(it.req.Key)]
			out[it.idx].Claim, out[it.idx].Err = outcome(it.got, it.acquired, it.req)
			ks.last, ks.lerr = it, out[it.idx].Err
			ks.next++
		}
	}
}

// runRound executes the statements of one round: per table, sorted, in
// chunks of MaxBatch; tables in parallel.
func (s *Store) runRound(ctx context.Context, tx *sql.Tx, round []*item) error {
	byTable := map[string][]*item{}
	var tables []string
	for _, it := range round {
		if _, ok := byTable[it.l.table]; !ok {
			tables = append(tables, it.l.table)
		}
		byTable[it.l.table] = append(byTable[it.l.table], it)
	}
	var chunks [][]*item
	var chunkTable []string
	for _, t := range tables {
		its := byTable[t]
		slices.SortFunc(its, func(a, b *item) int {
			if a.l.kt != b.l.kt {
				if a.l.kt < b.l.kt {
					return -1
				}
				return 1
			}
			return bytes.Compare(a.l.hash[:], b.l.hash[:])
		})
		for len(its) > 0 {
			n := min(len(its), s.cfg.MaxBatch)
			chunks = append(chunks, its[:n])
			chunkTable = append(chunkTable, t)
			its = its[n:]
		}
	}
	errs := make([]error, len(chunks))
	run := func(i int) {
		c, err := s.conn(ctx)
		if err != nil {
			errs[i] = err
			return
		}
		defer c.Close()
		errs[i] = s.claimChunk(ctx, c, chunkTable[i], chunks[i], false)
	}
	switch {
	case tx != nil:
		// One connection: one statement at a time, no retry (a deadlock
		// rolled the caller's transaction back).
		for i := range chunks {
			if err := s.claimChunk(ctx, tx, chunkTable[i], chunks[i], true); err != nil {
				return s.claimErr(nil, err)
			}
		}
		return nil
	case len(chunks) == 1:
		run(0)
	default:
		var wg sync.WaitGroup
		for i := range chunks {
			wg.Go(func() { run(i) })
		}
		wg.Wait()
	}
	var firstErr error
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if firstErr == nil {
		return nil
	}
	if failed < len(chunks) {
		return fmt.Errorf("%w: mysqlstore: %d of %d batch statements failed: %w", idem.ErrUnknownOutcome, failed, len(chunks), firstErr)
	}
	if isServerErr(firstErr, erLockWaitTimeout) {
		// Every statement timed out on a locked row: nothing applied.
		return fmt.Errorf("%w: mysqlstore: batch waited too long for a row lock: %w", idem.ErrUnavailable, firstErr)
	}
	return s.claimErr(nil, firstErr)
}

// ---- token operations ----

type finishOp struct {
	name   string
	set    func(sb *strings.Builder) // SET clause without updated_at
	target idem.State                // state a repeat with the same token finds
}

// finish applies a token operation: one conditional UPDATE; only when it
// changed nothing, one read to tell not-found, fenced and an idempotent
// repeat apart (and, if the record changed in between so that the UPDATE
// would now apply, the UPDATE again).
func (s *Store) finish(ctx context.Context, q querier, key []byte, token uint64, op finishOp) error {
	l, err := s.locate(key)
	if err != nil {
		return err
	}
	var sb strings.Builder
	sb.WriteString("UPDATE ")
	sb.WriteString(l.table)
	sb.WriteString(forcePK + " SET ")
	op.set(&sb)
	sb.WriteString(", updated_at = " + nowUS + " WHERE ")
	s.pk(&sb, l)
	finishCond(&sb, func(sb *strings.Builder) { uintLit(sb, token) })
	update := sb.String()
	sb.Reset()
	sb.WriteString("SELECT state, token FROM ")
	sb.WriteString(l.table)
	sb.WriteString(forcePK + " WHERE ")
	s.pk(&sb, l)
	sb.WriteString(" AND k = ")
	hexLit(&sb, key)
	sb.WriteString(" AND expires_at > " + nowUS)
	_, inTx := q.(*sql.Tx)
	if inTx {
		// In a transaction a plain read sees its snapshot, which may be
		// older than the row the UPDATE judged: read the current row.
		sb.WriteString(" LOCK IN SHARE MODE")
	}
	read := sb.String()
	// The UPDATE and the read are two statements: the record may change
	// between them. Any verdict the read gives holds at the read, unless the
	// record now satisfies the UPDATE's condition (a claim issuing this very
	// token committed in between): then the operation would apply, and
	// neither "not found" nor "fenced" describes any order of the calls.
	// Run the UPDATE again.
	for attempt := 0; ; attempt++ {
		var res sql.Result
		err = s.retry(ctx, !inTx, func() error {
			var err error
			res, err = q.ExecContext(ctx, update)
			return err
		})
		if err != nil {
			return mapErr(err, true)
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			return nil
		}
		var st int
		var cur uint64
		err = q.QueryRowContext(ctx, read).Scan(&st, &cur)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: key %q", idem.ErrNotFound, truncKey(key))
		}
		if err != nil {
			return mapErr(err, false)
		}
		if err := checkStored(key, st, cur); err != nil {
			return err
		}
		if cur != token || idem.State(st) != idem.StateInProgress {
			return op.verdict(key, token, idem.State(st), cur)
		}
		if attempt >= 3 {
			return fmt.Errorf("%w: mysqlstore: %s of key %q: the record kept changing between the statements", idem.ErrUnavailable, op.name, truncKey(key))
		}
	}
}

// finishConn runs finish in autocommit on a connection of its own.
func (s *Store) finishConn(ctx context.Context, key []byte, token uint64, op finishOp) error {
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return s.finish(ctx, c, key, token, op)
}

// finishCond writes the condition under which a token operation applies:
// the caller's token still holds a live in-progress record. tok writes the
// token (a literal, or a column of CompleteBatch's derived table).
func finishCond(sb *strings.Builder, tok func(*strings.Builder)) {
	sb.WriteString(" AND token = ")
	tok(sb)
	sb.WriteString(" AND state = 1 AND expires_at > " + nowUS)
}

// verdict judges a token operation that changed nothing, from the live
// record read afterwards: the same token already in the target state is an
// idempotent repeat (nil); anything else is fenced.
func (op finishOp) verdict(key []byte, token uint64, st idem.State, cur uint64) error {
	if cur == token && st == op.target {
		return nil
	}
	return fmt.Errorf("%w: %s key %q with token %d (current token %d, state %s)", idem.ErrFenced, op.name, truncKey(key), token, cur, st)
}

func completeOp(result []byte) finishOp {
	return completeOpWith(func(sb *strings.Builder) {
		if len(result) == 0 {
			sb.WriteString("NULL")
		} else {
			hexLit(sb, result)
		}
	})
}

// completeOpWith is Complete's operation with the result written by res
// (a literal, or a column of CompleteBatch's derived table).
func completeOpWith(res func(*strings.Builder)) finishOp {
	return finishOp{name: "complete", target: idem.StateCompleted, set: func(sb *strings.Builder) {
		sb.WriteString("state = 2, result = ")
		res(sb)
		sb.WriteString(", expires_at = " + nowUS + " + ttl_us")
	}}
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateResult(result); err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.finishConn(ctx, key, token, completeOp(result))
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.finishConn(ctx, key, token, releaseOp(cause))
}

func releaseOp(cause string) finishOp {
	return finishOp{name: "release", target: idem.StateReleased, set: func(sb *strings.Builder) {
		sb.WriteString("state = 4")
		if cause != "" {
			sb.WriteString(", last_error = ")
			hexLit(sb, []byte(cause))
		}
	}}
}

// Fail implements idem.Store.
func (s *Store) Fail(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.finishConn(ctx, key, token, failOp(cause))
}

func failOp(cause string) finishOp {
	return finishOp{name: "fail", target: idem.StateFailed, set: func(sb *strings.Builder) {
		sb.WriteString("state = 3, last_error = ")
		hexLit(sb, []byte(cause))
		sb.WriteString(", expires_at = " + nowUS + " + ttl_us")
	}}
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateLease(lease); err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.finishConn(ctx, key, token, extendOp(lease.Microseconds()))
}

func extendOp(leaseUS int64) finishOp {
	return extendOpWith(func(sb *strings.Builder) { intLit(sb, leaseUS) })
}

// extendOpWith is Extend's operation with the lease (µs) written by lease
// (a literal, or a column of ExtendBatch's derived table).
func extendOpWith(lease func(*strings.Builder)) finishOp {
	return finishOp{name: "extend", target: idem.StateInProgress, set: func(sb *strings.Builder) {
		sb.WriteString("lease_until = " + nowUS + " + ")
		lease(sb)
		sb.WriteString(", expires_at = GREATEST(expires_at, " + nowUS + " + ")
		lease(sb)
		sb.WriteByte(')')
	}}
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, key []byte) (idem.Record, error) {
	l, err := s.locate(key)
	if err != nil {
		return idem.Record{}, err
	}
	if err := s.check(ctx); err != nil {
		return idem.Record{}, err
	}
	c, err := s.conn(ctx)
	if err != nil {
		return idem.Record{}, err
	}
	defer c.Close()
	return s.get(ctx, c, key, l, "")
}

func (s *Store) get(ctx context.Context, q querier, key []byte, l loc, suffix string) (idem.Record, error) {
	var sb strings.Builder
	sb.WriteString("SELECT " + recCols + " FROM ")
	sb.WriteString(l.table)
	sb.WriteString(forcePK + " WHERE ")
	s.pk(&sb, l)
	sb.WriteString(" AND expires_at > " + nowUS + suffix)
	r, err := scanRow(q.QueryRowContext(ctx, sb.String()))
	if errors.Is(err, sql.ErrNoRows) {
		return idem.Record{}, fmt.Errorf("%w: key %q", idem.ErrNotFound, truncKey(key))
	}
	if err != nil {
		return idem.Record{}, mapErr(err, false)
	}
	if !bytes.Equal(r.rec.Key, key) {
		return idem.Record{}, errCollision
	}
	if r.bad != nil {
		return idem.Record{}, r.bad
	}
	return r.rec, nil
}

// Delete implements idem.Store (admin eviction). It expires the record in
// place (expires_at = 0) instead of removing the row: every read treats it
// as absent, the next claim replaces it as a fresh record, and Purge removes
// the row later. Removing it at once would let a claim that drew its token
// (NEXTVAL in the inserted row) before a concurrent claim and then waited
// for that claim's row lock find the key absent after the Delete and insert
// its smaller token: with the row left in place it finds the duplicate and
// takes the record over with a token drawn under the row lock, larger than
// every earlier one.
func (s *Store) Delete(ctx context.Context, key []byte) error {
	l, err := s.locate(key)
	if err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	var sb strings.Builder
	sb.WriteString("UPDATE ")
	sb.WriteString(l.table)
	sb.WriteString(forcePK + " SET expires_at = 0, lease_until = 0, updated_at = " + nowUS + " WHERE ")
	s.pk(&sb, l)
	sb.WriteString(" AND k = ")
	hexLit(&sb, key)
	sb.WriteString(" AND expires_at > 0")
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	err = s.retry(ctx, true, func() error {
		_, err := c.ExecContext(ctx, sb.String())
		return err
	})
	return mapErr(err, true)
}

// Ping implements idem.Pinger: the server answers and the table exists.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	rows, err := c.QueryContext(ctx, "SELECT 1 FROM "+s.n.tables[0]+" LIMIT 0")
	if err != nil {
		return mapErr(err, false)
	}
	return mapErr(rows.Close(), false)
}
