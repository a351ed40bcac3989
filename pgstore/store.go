package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// querier is what both *pgxpool.Pool and pgx.Tx offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Store is a PostgreSQL idem.Store. It implements idem.BatchClaimer,
// idem.BatchCompleter, idem.BatchExtender, idem.Purger, idem.Lister, idem.Stater, idem.Pinger
// and idem.ErrorClassifier.
type Store struct {
	orig   Config
	cfg    Config
	pool   *pgxpool.Pool
	ns     string
	tables []tableSQL
	hist   string
	closed atomic.Bool
	// ownPool: the Store made its pool (URLConfig.Open) and closes it.
	ownPool bool

	partMu sync.Mutex
	parts  map[int64]bool // partition start (unix s) -> known to exist
}

var (
	_ idem.Store          = (*Store)(nil)
	_ idem.BatchClaimer   = (*Store)(nil)
	_ idem.Purger         = (*Store)(nil)
	_ idem.Lister         = (*Store)(nil)
	_ idem.Stater         = (*Store)(nil)
	_ idem.Pinger         = (*Store)(nil)
	_ idem.BatchCompleter = (*Store)(nil)
	_ idem.BatchExtender  = (*Store)(nil)
)

// New returns a Store for cfg. It does no I/O: run Migrate (or the
// pgstore-migrate command) first, and CheckSchema to verify.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	s := &Store{orig: cfg, cfg: c, pool: c.Pool, ns: c.Namespace, hist: ident(c.Schema, c.historyTable()), parts: map[int64]bool{}}
	for _, t := range c.recordTables() {
		s.tables = append(s.tables, buildSQL(c, t))
	}
	return s, nil
}

// Close marks the Store closed. It does not close the pool, which the
// caller owns, unless the Store made it (URLConfig.Open).
func (s *Store) Close() error {
	if !s.closed.Swap(true) && s.ownPool {
		s.pool.Close()
	}
	return nil
}

// Ping implements idem.Pinger.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.mapErr(ctx, s.pool.Ping(ctx), false)
}

// Record states as stored in the state column.
const (
	stInProgress = int16(idem.StateInProgress)
	stCompleted  = int16(idem.StateCompleted)
	stFailed     = int16(idem.StateFailed)
	stReleased   = int16(idem.StateReleased)
)

// hashLen is the stored key hash length: 16 bytes of SHA-256. Collisions
// are astronomically unlikely, and still detected: the raw key is stored
// beside the hash and compared on every lookup.
const hashLen = 16

// keyRef is a validated key with its index columns.
type keyRef struct {
	key   []byte
	hash  []byte
	ktime time.Time // timed layouts only
	table int
}

// tokenRef checks the key and token of a token-checked mutation and
// locates the key's row: a token above the int64 range was never issued
// (ErrFenced).
func (s *Store) tokenRef(key []byte, token uint64) (keyRef, error) {
	if err := idem.ValidateToken(key, token); err != nil {
		return keyRef{}, err
	}
	if token > 1<<63-1 {
		return keyRef{}, fmt.Errorf("%w: token %d was never issued", idem.ErrFenced, token)
	}
	return s.ref(key)
}

func (s *Store) ref(key []byte) (keyRef, error) {
	if err := idem.ValidateKey(key); err != nil {
		return keyRef{}, err
	}
	sum := sha256.Sum256(key)
	r := keyRef{key: key, hash: sum[:hashLen]}
	if s.cfg.Layout == LayoutSharded {
		r.table = int(binary.BigEndian.Uint32(sum[hashLen:]) % uint32(s.cfg.Shards))
	}
	if s.cfg.Layout.timed() {
		t, err := s.cfg.KeyTime(key)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				err = fmt.Errorf("%w: %w", idem.ErrInvalidKey, err)
			}
			return keyRef{}, err
		}
		// timestamptz holds microseconds; truncate so the stored value
		// equals what we compare against.
		r.ktime = t.Truncate(time.Microsecond).UTC()
		if r.ktime.Year() < 1 || r.ktime.Year() > 9999 {
			return keyRef{}, fmt.Errorf("%w: key time %s outside years 1..9999", idem.ErrInvalidKey, r.ktime)
		}
	}
	return r, nil
}

// args returns the key parameters ($1 ns, $2 hash[, $3 key_time]).
func (s *Store) args(r keyRef, more ...any) []any {
	a := make([]any, 0, 3+len(more))
	a = append(a, s.ns, r.hash)
	if s.cfg.Layout.timed() {
		a = append(a, r.ktime)
	}
	return append(a, more...)
}

// begin checks the store and context before any I/O.
func (s *Store) begin(ctx context.Context) error {
	if s.closed.Load() {
		return idem.ErrClosed
	}
	return ctx.Err()
}

// row is one record row as read back.
type row struct {
	hash     []byte
	key      []byte
	state    int16
	token    int64
	fp       []byte
	result   []byte
	attempts int32
	lastErr  string
	lease    time.Time
	expires  time.Time
	created  time.Time
	updated  time.Time
	ttlUS    int64
	now      time.Time
	acquired bool
}

// rowCols lists the columns every read returns, in row order (after
// key_hash). Keep in sync with scanRow.
const rowCols = "key, state, token, fingerprint, result, attempts, last_error, lease_until, expires_at, created_at, updated_at, ttl_us"

func scanRow(sc interface{ Scan(...any) error }, withHash bool) (row, error) {
	var r row
	var buf [15]any
	err := sc.Scan(r.targets(buf[:0], withHash)...)
	return r, err
}

// targets appends the scan destinations of r (in rowCols order, plus now
// and acquired) to dst, so a caller scanning many rows can reuse dst.
func (r *row) targets(dst []any, withHash bool) []any {
	if withHash {
		dst = append(dst, &r.hash)
	}
	return append(dst, &r.key, &r.state, &r.token, &r.fp, &r.result, &r.attempts, &r.lastErr, &r.lease, &r.expires, &r.created, &r.updated, &r.ttlUS, &r.now, &r.acquired)
}

func (r row) record() idem.Record {
	rec := idem.Record{
		Key: r.key, State: idem.State(r.state), Token: uint64(r.token), Result: r.result,
		Attempts: int(r.attempts), LastError: r.lastErr,
		LeaseUntil: r.lease, ExpiresAt: r.expires, CreatedAt: r.created, UpdatedAt: r.updated,
	}
	if len(r.fp) > 0 {
		rec.Fingerprint = r.fp
	}
	return rec
}

// errSettle means the statement's snapshot could not tell the outcome (a
// concurrent writer committed in between): run the claim again.
var errSettle = errors.New("pgstore: claim raced, retry")

// checkRecord reports a record that this version of pgstore cannot read
// as one of key: idem.ErrCorrupt, an error of that key alone. Every column
// has a SQL type, so what can be wrong is a value out of range: a state no
// version wrote (or a newer version's), a token that was never issued, or
// a raw key other than the one whose hash the row is filed under (damage,
// or a 128-bit SHA-256 prefix collision, which is not expected to occur).
func checkRecord(key, gotKey []byte, state int16, token int64) error {
	switch {
	case !bytes.Equal(gotKey, key):
		return fmt.Errorf("%w: pgstore: key %q: the record filed under its hash holds key %q", idem.ErrCorrupt, key, gotKey)
	case state < stInProgress || state > stReleased:
		return fmt.Errorf("%w: pgstore: key %q: state %d is unknown to this version", idem.ErrCorrupt, key, state)
	case token <= 0:
		return fmt.Errorf("%w: pgstore: key %q: token %d was never issued", idem.ErrCorrupt, key, token)
	}
	return nil
}

// classify turns a claim statement's row into the claim outcome, following
// the idem.Store rules in the same order as the SQL takeover condition.
func classify(r row, req idem.ClaimRequest) (idem.Claim, error) {
	if err := checkRecord(req.Key, r.key, r.state, r.token); err != nil {
		return idem.Claim{}, err
	}
	if r.acquired {
		return idem.Claim{Outcome: idem.OutcomeAcquired, Record: r.record()}, nil
	}
	if !r.expires.After(r.now) {
		return idem.Claim{}, errSettle
	}
	if len(r.fp) > 0 && len(req.Fingerprint) > 0 && !bytes.Equal(r.fp, req.Fingerprint) {
		return idem.Claim{}, fmt.Errorf("%w: key %q", idem.ErrFingerprintMismatch, req.Key)
	}
	switch {
	case r.state == stCompleted:
		return idem.Claim{Outcome: idem.OutcomeCompleted, Record: r.record()}, nil
	case r.state == stFailed:
		return idem.Claim{Outcome: idem.OutcomeFailed, Record: r.record()}, nil
	case r.state == stInProgress && r.lease.After(r.now):
		return idem.Claim{Outcome: idem.OutcomeInProgress, Record: r.record()}, nil
	}
	return idem.Claim{}, errSettle
}

// maxSettle bounds the claim retries after races and transient server
// errors (serialization failure, deadlock, missing partition).
const maxSettle = 10

// Claim implements idem.Store.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	r, err := s.ref(req.Key)
	if err != nil {
		return idem.Claim{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idem.Claim{}, err
	}
	return s.claim(ctx, s.pool, r, req, false)
}

// claim runs the claim statement on q until its outcome is settled. In a
// caller's transaction (inTx) a server error aborts the transaction, so it
// is returned at once (after recreating a missing partition, so that the
// transaction succeeds when run again).
func (s *Store) claim(ctx context.Context, q querier, r keyRef, req idem.ClaimRequest, inTx bool) (idem.Claim, error) {
	if err := s.ensurePartitionsFor(ctx, []keyRef{r}); err != nil {
		return idem.Claim{}, err
	}
	t := &s.tables[r.table]
	for attempt := 0; ; attempt++ {
		row, err := scanRow(q.QueryRow(ctx, t.claim, s.args(r, req.Key, req.Fingerprint, req.Lease.Microseconds(), req.TTL.Microseconds())...), false)
		if err == nil {
			var c idem.Claim
			c, err = classify(row, req)
			if err != errSettle {
				return c, err
			}
		} else if errors.Is(err, pgx.ErrNoRows) {
			err = errSettle // the conflicting row is newer than our snapshot
		}
		if isNoPartition(err) {
			if perr := s.recreatePartitions(ctx, []keyRef{r}); perr != nil {
				return idem.Claim{}, perr
			}
			if inTx {
				return idem.Claim{}, s.partitionRetryErr(err)
			}
		}
		if attempt+1 >= maxSettle || (inTx && err != errSettle) {
			return idem.Claim{}, s.mapErr(ctx, err, !inTx)
		}
		if err != errSettle && !s.retryable(ctx, err) {
			return idem.Claim{}, s.mapErr(ctx, err, !inTx)
		}
	}
}

// partitionRetryErr is the error of a claim in a caller's transaction that
// found no partition, once the partition has been recreated.
func (s *Store) partitionRetryErr(err error) error {
	return fmt.Errorf("%w: %w: %w", idem.ErrUnavailable, errPartitionRecreated, err)
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, key []byte) (idem.Record, error) {
	r, err := s.ref(key)
	if err != nil {
		return idem.Record{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idem.Record{}, err
	}
	return s.get(ctx, s.pool, r)
}

func (s *Store) get(ctx context.Context, q querier, r keyRef) (idem.Record, error) {
	row, err := scanRow(q.QueryRow(ctx, s.tables[r.table].get, s.args(r)...), false)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Record{}, fmt.Errorf("%w: key %q", idem.ErrNotFound, r.key)
	}
	if err != nil {
		return idem.Record{}, s.mapErr(ctx, err, false)
	}
	if err := checkRecord(r.key, row.key, row.state, row.token); err != nil {
		return idem.Record{}, err
	}
	return row.record(), nil
}

// Delete implements idem.Store. It marks the record expired instead of
// removing the row, so the next claim of the key goes through the row-locked
// takeover path and draws a token after every earlier one; Purge removes
// the row later.
func (s *Store) Delete(ctx context.Context, key []byte) error {
	r, err := s.ref(key)
	if err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, s.tables[r.table].del, s.args(r, r.key)...)
	return s.mapErr(ctx, err, true)
}

// mutation kinds for Complete, Release, Fail and Extend.
type mutation int

const (
	mutComplete mutation = iota
	mutRelease
	mutFail
	mutExtend
)

// repeatState is the state in which repeating a mutation with the same
// token is a no-op success (0: none).
var repeatState = [...]int16{mutComplete: stCompleted, mutRelease: stReleased, mutFail: stFailed, mutExtend: 0}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	if err := idem.ValidateResult(result); err != nil {
		return err
	}
	if result == nil {
		result = []byte{} // NULL would read back as "no result"; keep them alike
	}
	return s.mutateTop(ctx, mutComplete, key, token, result)
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.mutateTop(ctx, mutRelease, key, token, cause)
}

// Fail implements idem.Store.
func (s *Store) Fail(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.mutateTop(ctx, mutFail, key, token, cause)
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	if err := idem.ValidateLease(lease); err != nil {
		return err
	}
	return s.mutateTop(ctx, mutExtend, key, token, lease.Microseconds())
}

func (s *Store) mutateTop(ctx context.Context, m mutation, key []byte, token uint64, arg any) error {
	r, err := s.tokenRef(key, token)
	if err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.mutate(ctx, s.pool, m, r, token, arg, false)
}

// mutAnswer is what a mutation statement reads back: whether it applied,
// and the record's current state, token and key (nil state: no record).
type mutAnswer struct {
	done  bool
	state *int16
	cur   *int64
	key   []byte
}

// judge turns a mutation's answer into its result: nil (applied, or a
// repeat with the same token), ErrNotFound, ErrFenced, ErrCorrupt, or
// errSettle (our snapshot predates a concurrent change: ask again).
func (a *mutAnswer) judge(m mutation, r keyRef, token uint64) error {
	switch {
	case a.done:
		return nil
	case a.state == nil:
		return fmt.Errorf("%w: key %q", idem.ErrNotFound, r.key)
	}
	if err := checkRecord(r.key, a.key, *a.state, *a.cur); err != nil {
		return err
	}
	switch {
	case uint64(*a.cur) == token && *a.state == repeatState[m]:
		return nil
	case uint64(*a.cur) == token && *a.state == stInProgress:
		return errSettle
	}
	return fmt.Errorf("%w: key %q token %d (current %d, %s)", idem.ErrFenced, r.key, token, *a.cur, idem.State(*a.state))
}

// mutate applies a token-checked update in one statement, which also reads
// the record so a miss can be told apart (not found, fenced, repeat).
func (s *Store) mutate(ctx context.Context, q querier, m mutation, r keyRef, token uint64, arg any, inTx bool) error {
	return s.mutateX(ctx, q, m, r, token, arg, inTx, nil)
}

// mutateX is mutate; with xid set (a completion in DoTx's transaction) it
// also reads the transaction's id into *xid and sets the transaction's
// idle_in_transaction_session_timeout to CommitIdleTimeout, in the same
// statement (see resolveCommit).
func (s *Store) mutateX(ctx context.Context, q querier, m mutation, r keyRef, token uint64, arg any, inTx bool, xid *string) error {
	t := &s.tables[r.table]
	sql, args := t.mut[m], s.args(r, int64(token), arg, r.key)
	var a mutAnswer
	dst := []any{&a.done, &a.state, &a.cur, &a.key}
	if xid != nil {
		sql = t.completeX
		args = append(args, fmt.Sprint(s.cfg.CommitIdleTimeout.Milliseconds()))
		var set string
		dst = append(dst, xid, &set)
	}
	for attempt := 0; ; attempt++ {
		a = mutAnswer{}
		err := q.QueryRow(ctx, sql, args...).Scan(dst...)
		if err == nil {
			if err = a.judge(m, r, token); err != errSettle {
				return err
			}
		}
		if attempt+1 >= maxSettle || (inTx && err != errSettle) || (err != errSettle && !s.retryable(ctx, err)) {
			return s.mapErr(ctx, err, !inTx)
		}
	}
}

// Tokens are sequence values times tokenScale: a single claim and every
// takeover use nextval*tokenScale, and ClaimBatch's fast path draws one
// nextval per statement and numbers its rows v*tokenScale+0..tokenScale-1
// (so a statement carries at most tokenScale rows). Every token is thus
// above every token drawn from an earlier sequence value, whichever path
// drew it. A takeover draws its value after the row lock is held, so it
// exceeds every token the row ever had.
const tokenScale = 1024

var tokenScaleSQL = fmt.Sprint(tokenScale)

// tableSQL holds the statements for one physical (or parent) table.
type tableSQL struct {
	name  string // quoted
	claim string
	batch string
	fast  string // ClaimBatch's insert-only first statement
	fastU string // fast with one lease and TTL for all rows
	get   string
	del   string
	mut   [4]string
	// completeX is mut[mutComplete] for DoTx: it also returns the
	// transaction id and sets idle_in_transaction_session_timeout ($n+4 ms)
	// for the rest of the transaction.
	completeX string
	purge     string
	purgeA    string // purge with archival
	list      string
	stats     string
}

// buildSQL renders the statements for table t. Every time comparison uses
// statement_timestamp(): the database clock, one value per statement, shared
// by all workers, and fresh per statement inside a caller's transaction.
func buildSQL(c Config, t string) tableSQL {
	timed := c.Layout.timed()
	T := ident(c.Schema, t)
	seq := ident(c.Schema, c.sequence())
	nk := 2
	kcond := func(a string) string { return a + ".ns = $1 AND " + a + ".key_hash = $2" }
	kcols, kvals := "ns, key_hash", "$1, $2"
	if timed {
		nk = 3
		kcond = func(a string) string {
			return a + ".ns = $1 AND " + a + ".key_time = $3 AND " + a + ".key_hash = $2"
		}
		kcols, kvals = "ns, key_time, key_hash", "$1, $3, $2"
	}
	p := func(i int) string { return fmt.Sprintf("$%d", nk+i) }
	now := "statement_timestamp()"
	us := " * interval '1 microsecond'"
	// The takeover condition: the record is past retention (absent), or it
	// is released / its lease has expired and the fingerprints agree.
	takeover := `r.key = EXCLUDED.key AND (r.expires_at <= ` + now + `
	 OR ((r.state = 4 OR (r.state = 1 AND r.lease_until <= ` + now + `))
	     AND (r.fingerprint = '' OR EXCLUDED.fingerprint = '' OR r.fingerprint = EXCLUDED.fingerprint)))`
	// newToken draws a fresh token (see tokenScale).
	newToken := `nextval('` + seq + `') * ` + tokenScaleSQL
	// On takeover of an expired record everything restarts as for a new
	// one. The token is drawn here, after the row lock is held, so it is
	// larger than any token the row ever had.
	set := `token = ` + newToken + `,
	state = 1,
	attempts = CASE WHEN r.expires_at <= ` + now + ` THEN 1 ELSE r.attempts + 1 END,
	fingerprint = CASE WHEN r.expires_at <= ` + now + ` OR r.fingerprint = '' THEN EXCLUDED.fingerprint ELSE r.fingerprint END,
	result = NULL,
	last_error = CASE WHEN r.expires_at <= ` + now + ` THEN '' ELSE r.last_error END,
	created_at = CASE WHEN r.expires_at <= ` + now + ` THEN EXCLUDED.created_at ELSE r.created_at END,
	lease_until = EXCLUDED.lease_until,
	expires_at = EXCLUDED.expires_at,
	updated_at = EXCLUDED.updated_at,
	ttl_us = EXCLUDED.ttl_us`
	insCols := kcols + ", key, state, token, fingerprint, attempts, lease_until, expires_at, created_at, updated_at, ttl_us"
	ret := "RETURNING " + prefixCols("r", rowCols)
	var s tableSQL
	s.name = T
	s.claim = `WITH ins AS (
INSERT INTO ` + T + ` AS r (` + insCols + `)
VALUES (` + kvals + `, ` + p(1) + `, 1, ` + newToken + `, coalesce(` + p(2) + `::bytea, ''), 1,
	` + now + ` + ` + p(3) + `::bigint` + us + `,
	` + now + ` + greatest(` + p(3) + `::bigint, ` + p(4) + `::bigint)` + us + `,
	` + now + `, ` + now + `, ` + p(4) + `::bigint)
ON CONFLICT (` + c.pkCols() + `) DO UPDATE SET ` + set + `
WHERE ` + takeover + `
` + ret + `)
SELECT ` + rowCols + `, ` + now + `, true FROM ins
UNION ALL
SELECT ` + prefixCols("r", rowCols) + `, ` + now + `, false FROM ` + T + ` r WHERE ` + kcond("r") + ` AND NOT EXISTS (SELECT 1 FROM ins)`

	// Batch: the same statement over unnest()ed arrays. Rows the insert
	// did not return are read back from the table in the same statement.
	reqCols := "key_hash, key, fp, lease_us, ttl_us"
	unnest := "unnest($2::bytea[], $3::bytea[], $4::bytea[], $5::bigint[], $6::bigint[])"
	selK := "$1, q.key_hash"
	// LATERAL ... LIMIT 1 pins the plan (LIMIT stops the planner from
	// flattening it into a join): one index probe per key missing from ins.
	// (A plain IN/semi-join let the planner scan the whole namespace.)
	joinK := "(SELECT key_hash FROM req EXCEPT SELECT key_hash FROM ins) AS m CROSS JOIN LATERAL (SELECT * FROM " + T + " t WHERE t.ns = $1 AND t.key_hash = m.key_hash LIMIT 1) AS r"
	if timed {
		reqCols += ", key_time"
		unnest = "unnest($2::bytea[], $3::bytea[], $4::bytea[], $5::bigint[], $6::bigint[], $7::timestamptz[])"
		selK = "$1, q.key_time, q.key_hash"
		joinK = "(SELECT key_time, key_hash FROM req EXCEPT SELECT key_time, key_hash FROM ins) AS m CROSS JOIN LATERAL (SELECT * FROM " + T + " t WHERE t.ns = $1 AND t.key_time = m.key_time AND t.key_hash = m.key_hash LIMIT 1) AS r"
	}
	insRet := ret + ", r.key_hash"
	if timed {
		insRet += ", r.key_time"
	}
	s.batch = `WITH req AS (SELECT * FROM ` + unnest + ` AS q(` + reqCols + `)),
ins AS (
INSERT INTO ` + T + ` AS r (` + insCols + `)
SELECT ` + selK + `, q.key, 1, ` + newToken + `, coalesce(q.fp, ''), 1,
	` + now + ` + q.lease_us` + us + `,
	` + now + ` + greatest(q.lease_us, q.ttl_us)` + us + `,
	` + now + `, ` + now + `, q.ttl_us
FROM req q
ON CONFLICT (` + c.pkCols() + `) DO UPDATE SET ` + set + `
WHERE ` + takeover + `
` + insRet + `)
SELECT key_hash, ` + rowCols + `, ` + now + `, true FROM ins
UNION ALL
SELECT r.key_hash, ` + prefixCols("r", rowCols) + `, ` + now + `, false FROM ` + joinK + `
WHERE (SELECT count(*) FROM ins) < cardinality($2::bytea[])` // one-time filter: skipped when every row was inserted

	// Fast path of ClaimBatch: the bare multi-row insert plus RETURNING of
	// what the client cannot compute. One nextval per statement (an
	// InitPlan, evaluated once) numbers the rows: token = v*tokenScale +
	// ordinality-1, so the client maps each returned token back to its
	// request. Keys that conflicted come back absent and go through the
	// batch statement above (the atomic ON CONFLICT DO UPDATE ... WHERE
	// takeover, token drawn under the row lock).
	fastUnnest := "unnest($2::bytea[], $3::bytea[], $4::bytea[], $5::bigint[], $6::bigint[]) WITH ORDINALITY AS q(key_hash, key, fp, lease_us, ttl_us, i)"
	if timed {
		fastUnnest = "unnest($2::bytea[], $3::bytea[], $4::bytea[], $5::bigint[], $6::bigint[], $7::timestamptz[]) WITH ORDINALITY AS q(key_hash, key, fp, lease_us, ttl_us, key_time, i)"
	}
	fast := func(unnest, lease, ttl string) string {
		return `INSERT INTO ` + T + ` AS r (` + insCols + `)
SELECT ` + selK + `, q.key, 1, (SELECT nextval('` + seq + `')) * ` + tokenScaleSQL + ` + q.i - 1, coalesce(q.fp, ''), 1,
	` + now + ` + ` + lease + us + `,
	` + now + ` + greatest(` + lease + `, ` + ttl + `)` + us + `,
	` + now + `, ` + now + `, ` + ttl + `
FROM ` + unnest + `
ON CONFLICT (` + c.pkCols() + `) DO NOTHING
RETURNING r.token, r.created_at`
	}
	s.fast = fast(fastUnnest, "q.lease_us", "q.ttl_us")
	// The same when every entry has the same lease and TTL (a guard's
	// batches): $5 and $6 are scalars, two arrays fewer to send and unnest.
	fastUnnest = "unnest($2::bytea[], $3::bytea[], $4::bytea[]) WITH ORDINALITY AS q(key_hash, key, fp, i)"
	if timed {
		fastUnnest = "unnest($2::bytea[], $3::bytea[], $4::bytea[], $7::timestamptz[]) WITH ORDINALITY AS q(key_hash, key, fp, key_time, i)"
	}
	s.fastU = fast(fastUnnest, "$5::bigint", "$6::bigint")

	s.get = `SELECT ` + prefixCols("r", rowCols) + `, ` + now + `, false FROM ` + T + ` r WHERE ` + kcond("r") + ` AND r.expires_at > ` + now
	s.del = `UPDATE ` + T + ` r SET expires_at = 'epoch', updated_at = ` + now + ` WHERE ` + kcond("r") + ` AND r.key = ` + p(1) + ` AND r.expires_at > ` + now

	// Mutations: a token-checked UPDATE plus, in the same statement, the
	// current state for telling "not found" from "fenced" from a repeat.
	// The raw key ($n+3) is checked too: a row whose key column differs is
	// damaged, and is reported (checkRecord), never changed.
	mutSet := [4]string{
		mutComplete: `state = 2, result = ` + p(2) + `::bytea, updated_at = ` + now + `, expires_at = ` + now + ` + r.ttl_us` + us,
		mutRelease:  `state = 4, last_error = CASE WHEN ` + p(2) + `::text = '' THEN r.last_error ELSE ` + p(2) + `::text END, updated_at = ` + now,
		mutFail:     `state = 3, last_error = ` + p(2) + `::text, updated_at = ` + now + `, expires_at = ` + now + ` + r.ttl_us` + us,
		mutExtend:   `lease_until = ` + now + ` + ` + p(2) + `::bigint` + us + `, expires_at = greatest(r.expires_at, ` + now + ` + ` + p(2) + `::bigint` + us + `), updated_at = ` + now,
	}
	mutSQL := func(set, more string) string {
		return `WITH upd AS (UPDATE ` + T + ` r SET ` + set + `
WHERE ` + kcond("r") + ` AND r.token = ` + p(1) + `::bigint AND r.key = ` + p(3) + ` AND r.state = 1 AND r.expires_at > ` + now + ` RETURNING 1)
SELECT EXISTS (SELECT 1 FROM upd), c.state, c.token, c.key` + more + ` FROM (SELECT 1) AS one
LEFT JOIN ` + T + ` c ON ` + kcond("c") + ` AND c.expires_at > ` + now
	}
	for m, set := range mutSet {
		s.mut[m] = mutSQL(set, "")
	}
	// (SELECT 1) AS one makes exactly one row, so set_config runs once.
	s.completeX = mutSQL(mutSet[mutComplete], `, pg_current_xact_id()::text, set_config('idle_in_transaction_session_timeout', `+p(4)+`::text, true)`)

	hcols := "ns, key_hash, key_time, " + rowCols
	dcols := "d.ns, d.key_hash, NULL::timestamptz, " + prefixCols("d", rowCols)
	vjoin := "t.ns = v.ns AND t.key_hash = v.key_hash"
	vcols := "ns, key_hash"
	if timed {
		dcols = "d.ns, d.key_hash, d.key_time, " + prefixCols("d", rowCols)
		vjoin += " AND t.key_time = v.key_time"
		vcols += ", key_time"
	}
	// Purge: one small batch per statement, skipping rows a claim holds;
	// the DELETE rechecks expiry on the latest row version, so a record
	// taken over meanwhile survives.
	purgeHead := `WITH v AS (SELECT ` + vcols + ` FROM ` + T + ` WHERE ns = $1 AND expires_at <= ` + now + `
	ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED),
d AS (DELETE FROM ` + T + ` t USING v WHERE ` + vjoin + ` AND t.expires_at <= ` + now + ` RETURNING t.*)`
	s.purge = purgeHead + ` SELECT count(*) FROM d`
	s.purgeA = purgeHead + `, a AS (INSERT INTO ` + ident(c.Schema, c.historyTable()) + ` (` + hcols + `) SELECT ` + dcols + ` FROM d)
SELECT count(*) FROM d`

	order := "key_hash"
	after := "key_hash > $2"
	if timed {
		order = "key_time, key_hash"
		after = "(key_time, key_hash) > ($3, $2)"
	}
	s.list = `SELECT key_hash, ` + rowCols + `, ` + now + `, false` + listTimeCol(timed) + ` FROM ` + T + `
WHERE ns = $1 AND state = 1 AND expires_at > ` + now + ` AND ` + after + ` ORDER BY ` + order + ` LIMIT ` + fmt.Sprintf("$%d", nk+1)
	s.stats = `SELECT state, count(*) FROM ` + T + ` WHERE ns = $1 AND expires_at > ` + now + ` GROUP BY state`
	return s
}

func listTimeCol(timed bool) string {
	if timed {
		return ", key_time"
	}
	return ", NULL::timestamptz"
}

func prefixCols(a, cols string) string {
	parts := strings.Split(cols, ", ")
	for i, p := range parts {
		parts[i] = a + "." + p
	}
	return strings.Join(parts, ", ")
}
