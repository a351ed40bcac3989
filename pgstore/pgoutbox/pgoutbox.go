package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults.
const (
	DefaultSchema = "public"
	DefaultTable  = "idem_outbox"
)

// Config configures an Outbox. Pool is required.
type Config struct {
	// Pool serves the relay's claims (one connection per claim loop while
	// its batch is out) and, with notifications, one listening connection
	// per Listen. The Outbox does not close it.
	Pool *pgxpool.Pool
	// Schema and Table name the outbox table: letters, digits and '_';
	// Table at most 48 bytes so index names fit.
	Schema, Table string
	// NewID makes the ID of a message enqueued without one, e.g. a
	// snowflake.Generator's NextString. Nil: such messages are refused.
	NewID func() (string, error)
	// Notify says how relays learn of new rows (default NotifyInTx).
	Notify NotifyMode
	// Channel is the LISTEN/NOTIFY channel (default "<schema>.<table>",
	// cut to 63 bytes).
	Channel string
	// Ordered makes Migrate create the index that ordered claims
	// (outbox.Config.Ordered: a key's later message waits for the earlier)
	// need, at the cost of one more index entry per enqueued message with a
	// key; without it ordered claims are refused.
	Ordered bool
	Logger  *slog.Logger
}

// NotifyMode says how listening relays are woken.
type NotifyMode uint8

const (
	// NotifyInTx: Enqueue sends NOTIFY inside the caller's transaction, in
	// the same round trip as its INSERT; PostgreSQL delivers it at commit.
	// Simplest, nothing to call. Cost: a notifying transaction holds a
	// database-wide lock from its commit's start to its end, so the commits
	// of enqueuing transactions cannot share an fsync (see
	// docs/benchmarks/outbox.md).
	NotifyInTx NotifyMode = iota
	// NotifyAfterCommit: Enqueue sends nothing; the caller calls
	// Outbox.Notify after its transaction commits, and a background
	// connection sends one NOTIFY per burst of calls. Same wake-ups without
	// the lock in the business transactions. A commit the caller does not
	// report is found by the relay's poll (1s).
	NotifyAfterCommit
	// NotifyOff: no notifications; relays poll (outbox.Config.PollInterval,
	// 100ms by default).
	NotifyOff
)

func (m NotifyMode) String() string {
	switch m {
	case NotifyInTx:
		return "in-tx"
	case NotifyAfterCommit:
		return "after-commit"
	case NotifyOff:
		return "off"
	}
	return fmt.Sprintf("notify(%d)", uint8(m))
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Channel == "" {
		c.Channel = c.Schema + "." + c.Table
		if len(c.Channel) > 63 {
			c.Channel = c.Channel[:63]
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks the configuration after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: pgoutbox: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
	}
	switch {
	case c.Pool == nil:
		return bad("Pool is required")
	case !identRE.MatchString(c.Schema) || len(c.Schema) > 63:
		return bad("schema %q: use letters, digits and '_' (at most 63)", c.Schema)
	case !identRE.MatchString(c.Table) || len(c.Table) > 48:
		return bad("table %q: use letters, digits and '_' (at most 48)", c.Table)
	case len(c.Channel) > 63:
		return bad("channel %q longer than 63 bytes", c.Channel)
	case c.Notify > NotifyOff:
		return bad("unknown notify mode %d", c.Notify)
	}
	return nil
}

// Outbox is a PostgreSQL outbox table: Enqueue inside the caller's pgx.Tx,
// and the outbox.Backend (with outbox.Notifier) for relays and operators.
// It is safe for concurrent use.
type Outbox struct {
	cfg  Config
	pool *pgxpool.Pool
	tbl  string // quoted schema.table
	sql  statements

	notifyOnce sync.Once
	notifyCh   chan struct{} // NotifyAfterCommit: a burst of Notify calls
	stop       chan struct{}
	stopped    sync.WaitGroup
	closeOnce  sync.Once
}

var (
	_ outbox.Backend  = (*Outbox)(nil)
	_ outbox.Notifier = (*Outbox)(nil)
)

// New returns an Outbox over cfg's table (made by Migrate).
func New(cfg Config) (*Outbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	o := &Outbox{cfg: c, pool: c.Pool, tbl: ident(c.Schema, c.Table), notifyCh: make(chan struct{}, 1), stop: make(chan struct{})}
	o.sql = newStatements(o.tbl, ident(c.Channel))
	return o, nil
}

type statements struct {
	insert1, insertN, notify, claim, claimOrdered, sent, settle, purge, stats, listFailed, requeue string
}

const rowCols = "seq, id, topic, key, headers, payload, attempts, next_attempt_at, created_at, updated_at, last_error"

func newStatements(tbl, channel string) statements {
	claim := `SELECT ` + rowCols + ` FROM ` + tbl + ` o
WHERE status = 0 AND next_attempt_at <= COALESCE($1::timestamptz, statement_timestamp())%s
ORDER BY next_attempt_at, seq
LIMIT $2
FOR UPDATE SKIP LOCKED`
	return statements{
		insert1: `INSERT INTO ` + tbl + ` (id, topic, key, headers, payload, next_attempt_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, statement_timestamp(), statement_timestamp(), statement_timestamp())`,
		insertN: `INSERT INTO ` + tbl + ` (id, topic, key, headers, payload, next_attempt_at, created_at, updated_at)
SELECT v.id, v.topic, v.key, v.headers, v.payload, statement_timestamp(), statement_timestamp(), statement_timestamp()
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::bytea[]) WITH ORDINALITY AS v(id, topic, key, headers, payload, ord)
ORDER BY v.ord`,
		notify: `NOTIFY ` + channel,
		claim:  fmt.Sprintf(claim, ""),
		// A key's row waits while an earlier row of the key is pending
		// (due or not, held by another claim or not): the index on
		// (key, seq) WHERE status = 0 answers that.
		claimOrdered: fmt.Sprintf(claim, `
AND (o.key = '' OR NOT EXISTS (SELECT 1 FROM `+tbl+` p WHERE p.status = 0 AND p.key = o.key AND p.seq < o.seq))`),
		// Rows are found by id, the primary key: seq has no index of
		// its own (one index less per enqueue).
		sent: `UPDATE ` + tbl + ` SET status = 1, attempts = attempts + 1, updated_at = COALESCE($2::timestamptz, statement_timestamp())
WHERE id = ANY($1::text[])`,
		settle: `UPDATE ` + tbl + ` t SET status = v.status, attempts = t.attempts + 1,
	next_attempt_at = CASE WHEN v.status = 0 THEN n.now + v.delay_us * interval '1 microsecond' ELSE t.next_attempt_at END,
	last_error = CASE WHEN v.status = 1 THEN t.last_error ELSE v.err END,
	updated_at = n.now
FROM unnest($1::text[], $2::smallint[], $3::bigint[], $4::text[]) AS v(id, status, delay_us, err),
	(SELECT COALESCE($5::timestamptz, statement_timestamp()) AS now) n
WHERE t.id = v.id`,
		purge: `DELETE FROM ` + tbl + ` WHERE id IN (
	SELECT id FROM ` + tbl + ` WHERE status = 1 AND updated_at < $1 ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
		stats: `SELECT (SELECT count(*) FROM ` + tbl + ` WHERE status = 0), (SELECT count(*) FROM ` + tbl + ` WHERE status = 2),
	(SELECT min(created_at) FROM ` + tbl + ` WHERE status = 0), statement_timestamp()`,
		listFailed: `SELECT ` + rowCols + ` FROM ` + tbl + ` WHERE status = 2 AND seq > $1 ORDER BY seq LIMIT $2`,
		requeue: `UPDATE ` + tbl + ` SET status = 0, attempts = 0, next_attempt_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE id = ANY($1::text[]) AND status = 2`,
	}
}

func ident(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Enqueue writes msgs into the outbox inside the caller's transaction tx
// and returns their IDs (made by Config.NewID where empty). They become
// visible to relays when tx commits, and vanish if it rolls back. Invalid
// messages fail with idem.ErrInvalidArgument before any statement runs
// (tx is untouched); an ID already in the outbox fails with
// outbox.ErrDuplicateID, and like any server error it aborts tx (roll it
// back). With NotifyInTx (the default) a NOTIFY sent in the same round trip
// wakes listening relays at commit; with NotifyAfterCommit call Notify
// once tx has committed.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	ids, err := o.Queue(ctx, b, msgs...)
	if err != nil {
		return nil, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, o.mapErr(err, true)
	}
	return ids, nil
}

// Queue is Enqueue for callers that pipeline: it checks msgs and adds
// their INSERT (and the NOTIFY) to b, and returns their IDs. Send b with
// tx.SendBatch inside the business transaction, together with the
// business statements (one round trip for all), and check its result
// before committing: a duplicate ID fails it with a unique violation
// (SQLSTATE 23505) on the outbox's primary key.
func (o *Outbox) Queue(ctx context.Context, b *pgx.Batch, msgs ...outbox.Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	ids := make([]string, len(msgs))
	if len(msgs) == 1 {
		m, hdr, err := outbox.Prepare(ctx, msgs[0], o.cfg.NewID)
		if err != nil {
			return nil, err
		}
		ids[0] = m.ID
		b.Queue(o.sql.insert1, m.ID, m.Topic, nonNil(m.Key), hdr, m.Payload)
	} else {
		topics := make([]string, len(msgs))
		keys, hdrs, payloads := make([][]byte, len(msgs)), make([][]byte, len(msgs)), make([][]byte, len(msgs))
		for i, raw := range msgs {
			m, hdr, err := outbox.Prepare(ctx, raw, o.cfg.NewID)
			if err != nil {
				return nil, err
			}
			ids[i], topics[i], keys[i], hdrs[i], payloads[i] = m.ID, m.Topic, nonNil(m.Key), hdr, m.Payload
		}
		b.Queue(o.sql.insertN, ids, topics, keys, hdrs, payloads)
	}
	if o.cfg.Notify == NotifyInTx {
		b.Queue(o.sql.notify)
	}
	return ids, nil
}

// Notifies reports whether relays are notified of new rows: with
// NotifyOff the relay polls instead of listening (see outbox.Notifier).
func (o *Outbox) Notifies() bool { return o.cfg.Notify != NotifyOff }

// Notify, with NotifyAfterCommit, wakes listening relays: call it after a
// transaction that enqueued has committed. It never blocks: a background
// goroutine sends one NOTIFY (on a pool connection) for all the calls made
// while the previous one was sent and in the 2ms after it. In the other
// modes it does nothing.
func (o *Outbox) Notify() {
	if o.cfg.Notify != NotifyAfterCommit {
		return
	}
	o.notifyOnce.Do(func() {
		o.stopped.Add(1)
		go o.notifier()
	})
	select {
	case o.notifyCh <- struct{}{}:
	default: // one is pending already: it covers this commit too
	}
}

func (o *Outbox) notifier() {
	defer o.stopped.Done()
	for {
		select {
		case <-o.stop:
			return
		case <-o.notifyCh:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := o.pool.Exec(ctx, o.sql.notify); err != nil {
			o.cfg.Logger.Warn("pgoutbox: NOTIFY after commit failed; relays will find the rows by polling", "err", err)
		}
		cancel()
		// Calls made meanwhile wait for the next NOTIFY: a busy producer
		// sends at most one per notifyGap, not one per commit.
		select {
		case <-o.stop:
			return
		case <-time.After(notifyGap):
		}
	}
}

// notifyGap is the least time between two NOTIFYs of NotifyAfterCommit:
// it adds at most that much to a wake-up and caps the NOTIFY rate at 500/s.
const notifyGap = 2 * time.Millisecond

// Close stops the background notifier of NotifyAfterCommit (if it was
// started). It does not close the pool.
func (o *Outbox) Close() error {
	o.closeOnce.Do(func() {
		close(o.stop)
		o.stopped.Wait()
	})
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Claim implements outbox.Backend: a transaction on its own pool
// connection holds the rows (FOR UPDATE SKIP LOCKED) until Settle commits
// or Release rolls back; if the relay dies, the server rolls it back when
// the connection drops.
func (o *Outbox) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.Batch, error) {
	if req.Limit < 1 {
		return nil, fmt.Errorf("%w: pgoutbox: claim limit %d < 1", idem.ErrInvalidArgument, req.Limit)
	}
	if req.Ordered && !o.cfg.Ordered {
		return nil, fmt.Errorf("%w: pgoutbox: ordered claims need Config.Ordered (and its index, made by Migrate)", idem.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := o.pool.Acquire(ctx)
	if err != nil {
		return nil, o.mapErr(err, false)
	}
	q := o.sql.claim
	if req.Ordered {
		q = o.sql.claimOrdered
	}
	// BEGIN and the SELECT in one round trip; the transaction stays open
	// on conn until Settle (UPDATE and COMMIT, one round trip) or Release.
	pb := &pgx.Batch{}
	pb.Queue("BEGIN")
	if req.Hold > 0 {
		// A claimer gone without closing the connection frees the rows
		// after Hold: the server ends a session idle in its transaction
		// for longer (SET LOCAL: only this transaction).
		ms := min(max(req.Hold.Milliseconds(), 1), math.MaxInt32)
		pb.Queue("SET LOCAL idle_in_transaction_session_timeout = " + strconv.FormatInt(ms, 10))
	}
	pb.Queue(q, optTime(req.Now), req.Limit)
	br := conn.SendBatch(ctx, pb)
	_, err = br.Exec()
	if err == nil && req.Hold > 0 {
		_, err = br.Exec()
	}
	var out []outbox.Row
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			out, err = scanRows(rows)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		discard(ctx, conn)
		return nil, o.mapErr(err, false)
	}
	b := &batch{o: o, conn: conn, rows: out, ids: make(map[int64]string, len(out))}
	for _, r := range out {
		b.ids[r.Seq] = r.ID
	}
	if len(out) == 0 {
		_ = b.Release(ctx)
	}
	return b, nil
}

// discard ends conn's transaction by rolling it back, or, when that fails,
// by closing the connection (the server then rolls back), and returns it to
// the pool.
func discard(ctx context.Context, conn *pgxpool.Conn) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(rctx)
	}
	conn.Release()
}

func optTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

func scanRows(rows pgx.Rows) ([]outbox.Row, error) {
	defer rows.Close()
	var out []outbox.Row
	for rows.Next() {
		var r outbox.Row
		var hdr []byte
		if err := rows.Scan(&r.Seq, &r.ID, &r.Topic, &r.Key, &hdr, &r.Payload, &r.Attempts, &r.NextAttemptAt, &r.CreatedAt, &r.UpdatedAt, &r.LastError); err != nil {
			return nil, err
		}
		h, err := outbox.DecodeHeaders(hdr)
		if err != nil {
			r.Bad = err.Error() // the relay fails it; the claim goes on
		}
		r.Headers = h
		if len(r.Key) == 0 {
			r.Key = nil
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

type batch struct {
	o    *Outbox
	conn *pgxpool.Conn // in the claim's transaction
	rows []outbox.Row
	ids  map[int64]string // seq -> id
	done bool
}

func (b *batch) Rows() []outbox.Row { return b.rows }

// Settle implements outbox.Batch: one UPDATE and the COMMIT.
func (b *batch) Settle(ctx context.Context, s outbox.Settlement) error {
	if b.done {
		return outbox.ErrBatchEnded
	}
	if err := s.Check(func(seq int64) bool { _, ok := b.ids[seq]; return ok }); err != nil {
		return err
	}
	n := s.Len()
	b.done = true
	pb := &pgx.Batch{}
	switch {
	case n == 0:
	case len(s.Sent) == n:
		ids := make([]string, len(s.Sent))
		for i, seq := range s.Sent {
			ids[i] = b.ids[seq]
		}
		pb.Queue(b.o.sql.sent, ids, optTime(s.Now))
	default:
		ids, states, delays, errs := make([]string, 0, n), make([]int16, 0, n), make([]int64, 0, n), make([]string, 0, n)
		for _, seq := range s.Sent {
			ids, states, delays, errs = append(ids, b.ids[seq]), append(states, int16(outbox.StatusSent)), append(delays, 0), append(errs, "")
		}
		for _, r := range s.Retry {
			ids, states, delays, errs = append(ids, b.ids[r.Seq]), append(states, int16(outbox.StatusPending)), append(delays, r.Delay.Microseconds()), append(errs, outbox.TruncateError(r.Err))
		}
		for _, f := range s.Failed {
			ids, states, delays, errs = append(ids, b.ids[f.Seq]), append(states, int16(outbox.StatusFailed)), append(delays, 0), append(errs, outbox.TruncateError(f.Err))
		}
		pb.Queue(b.o.sql.settle, ids, states, delays, errs, optTime(s.Now))
	}
	updates := pb.Len()
	pb.Queue("COMMIT")
	br := b.conn.SendBatch(ctx, pb)
	var err error
	for i := 0; i < updates && err == nil; i++ {
		_, err = br.Exec()
	}
	if err != nil {
		// The UPDATE failed: the server skips the COMMIT; roll back.
		_ = br.Close()
		discard(ctx, b.conn)
		return b.o.mapErr(err, false)
	}
	_, err = br.Exec() // COMMIT
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		discard(ctx, b.conn)
		return b.o.mapErr(err, true) // the commit may or may not have happened
	}
	b.conn.Release()
	return nil
}

// Release implements outbox.Batch.
func (b *batch) Release(ctx context.Context) error {
	if b.done {
		return nil
	}
	b.done = true
	discard(ctx, b.conn)
	return nil
}

// PurgeSent implements outbox.Backend.
func (o *Outbox) PurgeSent(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 1 {
		return 0, fmt.Errorf("%w: pgoutbox: purge limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	tag, err := o.pool.Exec(ctx, o.sql.purge, before, limit)
	if err != nil {
		return 0, o.mapErr(err, true)
	}
	return int(tag.RowsAffected()), nil
}

// Stats implements outbox.Backend.
func (o *Outbox) Stats(ctx context.Context) (outbox.Stats, error) {
	var s outbox.Stats
	var oldest *time.Time
	if err := o.pool.QueryRow(ctx, o.sql.stats).Scan(&s.Pending, &s.Failed, &oldest, &s.At); err != nil {
		return outbox.Stats{}, o.mapErr(err, false)
	}
	if oldest != nil {
		s.OldestPending = *oldest
	}
	return s, nil
}

// ListFailed implements outbox.Backend.
func (o *Outbox) ListFailed(ctx context.Context, afterSeq int64, limit int) ([]outbox.Row, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: pgoutbox: list limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	rows, err := o.pool.Query(ctx, o.sql.listFailed, afterSeq, limit)
	if err != nil {
		return nil, o.mapErr(err, false)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, o.mapErr(err, false)
	}
	for i := range out {
		out[i].Status = outbox.StatusFailed
	}
	return out, nil
}

// Requeue implements outbox.Backend (and notifies listening relays).
func (o *Outbox) Requeue(ctx context.Context, ids []string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, o.sql.requeue, ids)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		if n > 0 && o.cfg.Notify != NotifyOff {
			_, err = tx.Exec(ctx, o.sql.notify)
		}
		return err
	})
	if err != nil {
		return 0, o.mapErr(err, true)
	}
	return int(n), nil
}

// Listen implements outbox.Notifier: LISTEN on a connection taken out of
// the pool for as long as it runs, re-established (with backoff) after a
// failure; wake is called after each notification and each (re)connect.
func (o *Outbox) Listen(ctx context.Context, wake func()) error {
	delay := time.Duration(0)
	for {
		err := o.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return nil
		}
		delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
		o.cfg.Logger.Warn("pgoutbox: LISTEN connection failed; reconnecting", "channel", o.cfg.Channel, "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

func (o *Outbox) listenOnce(ctx context.Context, wake func()) error {
	pc, err := o.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // held for as long as we listen; never back into the pool
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+ident(o.cfg.Channel)); err != nil {
		return err
	}
	wake() // notifications sent before LISTEN are lost: look now
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}

// mapErr maps a driver error onto idem's sentinels, keeping the cause: a
// unique violation of the id -> outbox.ErrDuplicateID; the server
// answered with an error, or the request never left -> idem.ErrUnavailable;
// otherwise, for a write (a connection lost mid-commit) ->
// idem.ErrUnknownOutcome.
func (o *Outbox) mapErr(err error, write bool) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) || errors.Is(err, idem.ErrInvalidArgument) {
		return err
	}
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &pe) && pe.Code == "23505":
		return fmt.Errorf("%w: pgoutbox: %w", outbox.ErrDuplicateID, err)
	case errors.As(err, &pe), errors.As(err, &ce), pgconn.SafeToRetry(err), !write:
		return fmt.Errorf("%w: pgoutbox: %w", idem.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: pgoutbox: %w", idem.ErrUnknownOutcome, err)
}
