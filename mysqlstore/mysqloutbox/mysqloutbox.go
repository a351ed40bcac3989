package mysqloutbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/outbox"
)

// Defaults.
const (
	DefaultTable        = "idem_outbox"
	DefaultVersionTable = "idem_outbox_schema_versions"
)

// MaxStatement is the most an Enqueue puts in one INSERT (bytes of SQL);
// a message at the outbox's limits fits in one.
const MaxStatement = 12 << 20

// Config configures an Outbox. DB is required.
type Config struct {
	// DB is the pool (github.com/go-sql-driver/mysql); the relay holds
	// one connection per claim loop while its batch is out. The Outbox
	// does not close it. No DSN option is required: statements are sent
	// as text with every value inlined as a literal (one round trip each,
	// whatever interpolateParams says).
	DB *sql.DB
	// Table names the outbox table: letters, digits and '_', at most 48.
	Table string
	// VersionTable records the applied schema version (default
	// idem_outbox_schema_versions).
	VersionTable string
	// NewID makes the ID of a message enqueued without one, e.g. a
	// snowflake.Generator's NextString. Nil: such messages are refused.
	NewID func() (string, error)
	// Ordered makes Migrate create the index that ordered claims
	// (outbox.Config.Ordered) need, at the cost of one more index entry
	// per enqueued message; without it ordered claims are refused.
	Ordered bool
	Logger  *slog.Logger
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.VersionTable == "" {
		c.VersionTable = DefaultVersionTable
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
		return fmt.Errorf("%w: mysqloutbox: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
	}
	switch {
	case c.DB == nil:
		return bad("DB is required")
	case !identRE.MatchString(c.Table) || len(c.Table) > 48:
		return bad("table %q: use letters, digits and '_' (at most 48)", c.Table)
	case !identRE.MatchString(c.VersionTable) || len(c.VersionTable) > 64:
		return bad("version table %q: use letters, digits and '_' (at most 64)", c.VersionTable)
	}
	return nil
}

// Outbox is a MariaDB/MySQL outbox table: Enqueue inside the caller's
// *sql.Tx, and the outbox.Backend for relays and operators. It is safe for
// concurrent use. MariaDB has no notifications: relays poll.
type Outbox struct {
	cfg Config
	db  *sql.DB
	tbl string // quoted
	// noIdleTimeout: the server has no idle_transaction_timeout (MySQL),
	// so claims cannot be bounded by ClaimRequest.Hold.
	noIdleTimeout atomic.Bool
}

var _ outbox.Backend = (*Outbox)(nil)

// New returns an Outbox over cfg's table (made by Migrate).
func New(cfg Config) (*Outbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	return &Outbox{cfg: c, db: c.DB, tbl: quote(c.Table)}, nil
}

func quote(s string) string { return "`" + s + "`" }

// nowUS is the database clock in microseconds since the Unix epoch, fixed
// for one statement.
const nowUS = "TIMESTAMPDIFF(MICROSECOND,'1970-01-01 00:00:00',UTC_TIMESTAMP(6))"

// timeLit is t in microseconds, or the database clock when t is zero.
func timeLit(t time.Time) string {
	if t.IsZero() {
		return nowUS
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// hexLit appends b as a binary literal: nothing is spliced in as text.
func hexLit(sb *strings.Builder, b []byte) {
	sb.WriteString("X'")
	sb.WriteString(hex.EncodeToString(b))
	sb.WriteByte('\'')
}

func nullHexLit(sb *strings.Builder, b []byte) {
	if b == nil {
		sb.WriteString("NULL")
		return
	}
	hexLit(sb, b)
}

func intList(sb *strings.Builder, vs []int64) {
	for i, v := range vs {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.FormatInt(v, 10))
	}
}

// Enqueue writes msgs into the outbox inside the caller's transaction tx
// (one INSERT, or several when the messages are large) and returns their
// IDs (made by Config.NewID where empty). They become visible to relays
// when tx commits, and vanish if it rolls back. Invalid messages fail with
// idem.ErrInvalidArgument before any statement runs; an ID already in the
// outbox fails with outbox.ErrDuplicateID (MariaDB rolls back the call's
// statements only; the transaction goes on).
//
// Values travel as hex literals, twice their size: an INSERT holds at most
// MaxStatement bytes (a message at the limits takes about 8.2 MiB), so the
// server's max_allowed_packet must be at least 16 MiB (MariaDB's default;
// MySQL's is 64 MiB). A call whose messages need several statements runs
// them under a savepoint, so it is still all or nothing.
func (o *Outbox) Enqueue(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	ids := make([]string, len(msgs))
	head := "INSERT INTO " + o.tbl + " (id, topic, k, headers, payload, next_attempt_at, created_at, updated_at) VALUES "
	var stmts []string
	var sb strings.Builder
	for i, raw := range msgs {
		m, hdr, err := outbox.Prepare(ctx, raw, o.cfg.NewID)
		if err != nil {
			return nil, err
		}
		ids[i] = m.ID
		size := 2*(len(m.ID)+len(m.Topic)+len(m.Key)+len(hdr)+len(m.Payload)) + 3*len(nowUS) + 32
		if sb.Len() > 0 && sb.Len()+size > MaxStatement {
			stmts = append(stmts, sb.String())
			sb.Reset()
		}
		if sb.Len() == 0 {
			sb.WriteString(head)
		} else {
			sb.WriteByte(',')
		}
		sb.WriteByte('(')
		hexLit(&sb, []byte(m.ID))
		sb.WriteByte(',')
		hexLit(&sb, []byte(m.Topic))
		sb.WriteByte(',')
		hexLit(&sb, m.Key)
		sb.WriteByte(',')
		nullHexLit(&sb, hdr)
		sb.WriteByte(',')
		nullHexLit(&sb, m.Payload)
		sb.WriteString("," + nowUS + "," + nowUS + "," + nowUS + ")") // one value per statement
	}
	stmts = append(stmts, sb.String())
	if len(stmts) == 1 {
		if _, err := tx.ExecContext(ctx, stmts[0]); err != nil {
			return nil, mapErr(err, true)
		}
		return ids, nil
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT idem_outbox_enqueue"); err != nil {
		return nil, mapErr(err, true)
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			_, _ = tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT idem_outbox_enqueue")
			return nil, mapErr(err, true)
		}
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT idem_outbox_enqueue"); err != nil {
		return nil, mapErr(err, true)
	}
	return ids, nil
}

const rowCols = "seq, id, topic, k, headers, payload, attempts, next_attempt_at, created_at, updated_at, last_error"

// Claim implements outbox.Backend: a READ COMMITTED transaction holds the
// rows (FOR UPDATE SKIP LOCKED) until Settle commits or Release rolls back;
// if the relay dies, the server rolls it back when the connection drops.
func (o *Outbox) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.Batch, error) {
	if req.Limit < 1 {
		return nil, fmt.Errorf("%w: mysqloutbox: claim limit %d < 1", idem.ErrInvalidArgument, req.Limit)
	}
	if req.Ordered && !o.cfg.Ordered {
		return nil, fmt.Errorf("%w: mysqloutbox: ordered claims need Config.Ordered (and its index, made by Migrate)", idem.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// ctx bounds the claim (BEGIN and the SELECT), not the batch: the
	// transaction lives until Settle or Release, also when ctx ends
	// meanwhile (a relay shutting down after publishing still marks its
	// batch sent). database/sql rolls a transaction back when the context
	// given to BeginTx ends, so it gets one that ctx cancels only until
	// the claim returns.
	txCtx, txCancel := context.WithCancel(context.WithoutCancel(ctx))
	detach := context.AfterFunc(ctx, txCancel)
	tx, err := o.db.BeginTx(txCtx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		detach()
		txCancel()
		return nil, mapErr(err, false)
	}
	q := "SELECT " + rowCols + " FROM " + o.tbl + " o WHERE status = 0 AND next_attempt_at <= " + timeLit(req.Now)
	if req.Ordered {
		// A key's row waits while an earlier row of the key is pending
		// (a plain read: the locking clause does not reach the subquery).
		q += " AND (o.k = X'' OR NOT EXISTS (SELECT 1 FROM " + o.tbl + " p WHERE p.status = 0 AND p.k = o.k AND p.seq < o.seq))"
	}
	q += " ORDER BY next_attempt_at, seq LIMIT " + strconv.Itoa(req.Limit) + " FOR UPDATE SKIP LOCKED"
	rows, err := tx.QueryContext(ctx, q)
	var out []outbox.Row
	if err == nil {
		out, err = scanRows(rows)
	}
	if !detach() && err == nil { // ctx ended: the transaction is being rolled back
		err = ctx.Err()
	}
	idle := false
	if err == nil && len(out) > 0 && req.Hold > 0 {
		idle, err = o.boundIdle(ctx, tx, req.Hold)
	}
	if err != nil {
		_ = tx.Rollback()
		txCancel()
		return nil, mapErr(err, false)
	}
	b := &batch{o: o, tx: tx, cancel: txCancel, idle: idle, rows: out, seqs: make(map[int64]struct{}, len(out))}
	for _, r := range out {
		b.seqs[r.Seq] = struct{}{}
	}
	if len(out) == 0 {
		_ = b.Release(ctx)
	}
	return b, nil
}

// boundIdle makes the server end the claim's session (freeing its rows)
// when its transaction stays idle longer than hold, whole seconds rounded
// up: a relay gone without closing its connection (host power loss,
// partition, frozen process) would otherwise hold them until wait_timeout
// (8 hours by default). The setting is the session's: Settle and Release
// put it back before the connection returns to the pool. It reports
// whether it set it (not on a server without idle_transaction_timeout,
// MySQL).
func (o *Outbox) boundIdle(ctx context.Context, tx *sql.Tx, hold time.Duration) (bool, error) {
	if o.noIdleTimeout.Load() {
		return false, nil
	}
	secs := min(max(int64(math.Ceil(hold.Seconds())), 1), 31536000)
	_, err := tx.ExecContext(ctx, "SET SESSION idle_transaction_timeout = "+strconv.FormatInt(secs, 10))
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1193 { // unknown system variable
		o.noIdleTimeout.Store(true)
		o.cfg.Logger.Warn("mysqloutbox: the server has no idle_transaction_timeout; a relay gone without closing its connection holds its rows until wait_timeout")
		return false, nil
	}
	return err == nil, err
}

// unboundIdle puts back the session's idle_transaction_timeout that
// boundIdle set, also when ctx has ended: the connection goes back to the
// pool, where a business transaction may use it next.
func (b *batch) unboundIdle(ctx context.Context) error {
	if !b.idle {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := b.tx.ExecContext(rctx, "SET SESSION idle_transaction_timeout = DEFAULT")
	return err
}

func scanRows(rows *sql.Rows) ([]outbox.Row, error) {
	defer rows.Close()
	var out []outbox.Row
	for rows.Next() {
		var r outbox.Row
		var id, topic, lastErr, hdr []byte
		var next, created, updated int64
		if err := rows.Scan(&r.Seq, &id, &topic, &r.Key, &hdr, &r.Payload, &r.Attempts, &next, &created, &updated, &lastErr); err != nil {
			return nil, err
		}
		h, err := outbox.DecodeHeaders(hdr)
		if err != nil {
			r.Bad = err.Error() // the relay fails it; the claim goes on
		}
		r.ID, r.Topic, r.Headers, r.LastError = string(id), string(topic), h, string(lastErr)
		r.NextAttemptAt, r.CreatedAt, r.UpdatedAt = time.UnixMicro(next).UTC(), time.UnixMicro(created).UTC(), time.UnixMicro(updated).UTC()
		if len(r.Key) == 0 {
			r.Key = nil
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

type batch struct {
	o      *Outbox
	tx     *sql.Tx
	cancel context.CancelFunc // the transaction's context, once it ended
	idle   bool               // boundIdle set the session's idle timeout
	rows   []outbox.Row
	seqs   map[int64]struct{}
	done   bool
}

func (b *batch) Rows() []outbox.Row { return b.rows }

// Settle implements outbox.Batch: one UPDATE and the COMMIT.
func (b *batch) Settle(ctx context.Context, s outbox.Settlement) error {
	if b.done {
		return outbox.ErrBatchEnded
	}
	if err := s.Check(func(seq int64) bool { _, ok := b.seqs[seq]; return ok }); err != nil {
		return err
	}
	b.done = true
	defer b.cancel()
	if err := b.unboundIdle(ctx); err != nil {
		_ = b.tx.Rollback()
		return mapErr(err, false) // the session may have been ended: nothing applied
	}
	if s.Len() > 0 {
		if _, err := b.tx.ExecContext(ctx, b.o.settleSQL(s)); err != nil {
			_ = b.tx.Rollback()
			return mapErr(err, false) // rolled back: nothing applied
		}
	}
	if err := b.tx.Commit(); err != nil {
		return mapErr(err, true)
	}
	return nil
}

func (o *Outbox) settleSQL(s outbox.Settlement) string {
	var sb strings.Builder
	now := timeLit(s.Now)
	seqs := append([]int64(nil), s.Sent...)
	if len(s.Retry)+len(s.Failed) == 0 {
		sb.WriteString("UPDATE " + o.tbl + " SET status = 1, attempts = attempts + 1, updated_at = " + now + " WHERE seq IN (")
		intList(&sb, seqs)
		sb.WriteByte(')')
		return sb.String()
	}
	// CASE seq WHEN <seq> THEN <value> ... ELSE <column> END per column.
	sb.WriteString("UPDATE " + o.tbl + " SET status = CASE seq")
	for _, r := range s.Retry {
		fmt.Fprintf(&sb, " WHEN %d THEN 0", r.Seq)
		seqs = append(seqs, r.Seq)
	}
	for _, f := range s.Failed {
		fmt.Fprintf(&sb, " WHEN %d THEN 2", f.Seq)
		seqs = append(seqs, f.Seq)
	}
	sb.WriteString(" ELSE 1 END, ")
	if len(s.Retry) > 0 {
		sb.WriteString("next_attempt_at = CASE seq")
		for _, r := range s.Retry {
			fmt.Fprintf(&sb, " WHEN %d THEN %s + %d", r.Seq, now, r.Delay.Microseconds())
		}
		sb.WriteString(" ELSE next_attempt_at END, ")
	}
	sb.WriteString("last_error = CASE seq")
	for _, r := range s.Retry {
		fmt.Fprintf(&sb, " WHEN %d THEN ", r.Seq)
		hexLit(&sb, []byte(outbox.TruncateError(r.Err)))
	}
	for _, f := range s.Failed {
		fmt.Fprintf(&sb, " WHEN %d THEN ", f.Seq)
		hexLit(&sb, []byte(outbox.TruncateError(f.Err)))
	}
	sb.WriteString(" ELSE last_error END, attempts = attempts + 1, updated_at = " + now + " WHERE seq IN (")
	intList(&sb, seqs)
	sb.WriteByte(')')
	return sb.String()
}

// Release implements outbox.Batch.
func (b *batch) Release(ctx context.Context) error {
	if b.done {
		return nil
	}
	b.done = true
	defer b.cancel()
	_ = b.unboundIdle(ctx) // on a dead session Rollback fails too, and the connection is dropped
	if err := b.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return mapErr(err, false)
	}
	return nil
}

// PurgeSent implements outbox.Backend: the rows to delete are picked FOR
// UPDATE SKIP LOCKED (MariaDB has no LIMIT in an IN subquery), so purges
// running at once take different rows.
func (o *Outbox) PurgeSent(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 1 {
		return 0, fmt.Errorf("%w: mysqloutbox: purge limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	tx, err := o.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, mapErr(err, false)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, fmt.Sprintf("SELECT seq FROM %s WHERE status = 1 AND updated_at < %d ORDER BY updated_at LIMIT %d FOR UPDATE SKIP LOCKED",
		o.tbl, before.UnixMicro(), limit))
	if err != nil {
		return 0, mapErr(err, false)
	}
	var seqs []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return 0, mapErr(err, false)
		}
		seqs = append(seqs, s)
	}
	if err := rows.Err(); err != nil {
		return 0, mapErr(err, false)
	}
	if len(seqs) == 0 {
		return 0, nil
	}
	var sb strings.Builder
	sb.WriteString("DELETE FROM " + o.tbl + " WHERE seq IN (")
	intList(&sb, seqs)
	sb.WriteByte(')')
	res, err := tx.ExecContext(ctx, sb.String())
	if err != nil {
		return 0, mapErr(err, false)
	}
	if err := tx.Commit(); err != nil {
		return 0, mapErr(err, true)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Stats implements outbox.Backend.
func (o *Outbox) Stats(ctx context.Context) (outbox.Stats, error) {
	var s outbox.Stats
	var oldest sql.NullInt64
	var at int64
	err := o.db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM "+o.tbl+" WHERE status = 0), (SELECT COUNT(*) FROM "+o.tbl+
		" WHERE status = 2), (SELECT MIN(created_at) FROM "+o.tbl+" WHERE status = 0), "+nowUS).Scan(&s.Pending, &s.Failed, &oldest, &at)
	if err != nil {
		return outbox.Stats{}, mapErr(err, false)
	}
	s.At = time.UnixMicro(at).UTC()
	if oldest.Valid {
		s.OldestPending = time.UnixMicro(oldest.Int64).UTC()
	}
	return s, nil
}

// ListFailed implements outbox.Backend.
func (o *Outbox) ListFailed(ctx context.Context, afterSeq int64, limit int) ([]outbox.Row, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: mysqloutbox: list limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	rows, err := o.db.QueryContext(ctx, fmt.Sprintf("SELECT %s FROM %s WHERE status = 2 AND seq > %d ORDER BY seq LIMIT %d", rowCols, o.tbl, afterSeq, limit))
	if err != nil {
		return nil, mapErr(err, false)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, mapErr(err, false)
	}
	for i := range out {
		out[i].Status = outbox.StatusFailed
	}
	return out, nil
}

// Requeue implements outbox.Backend.
func (o *Outbox) Requeue(ctx context.Context, ids []string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var sb strings.Builder
	sb.WriteString("UPDATE " + o.tbl + " SET status = 0, attempts = 0, next_attempt_at = " + nowUS + ", updated_at = " + nowUS + " WHERE status = 2 AND id IN (")
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		hexLit(&sb, []byte(id))
	}
	sb.WriteByte(')')
	res, err := o.db.ExecContext(ctx, sb.String())
	if err != nil {
		return 0, mapErr(err, true)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// mapErr maps a driver error onto idem's sentinels: a duplicate id ->
// outbox.ErrDuplicateID; an error answered by the server, a failure to
// connect, or a failed read -> idem.ErrUnavailable; a connection lost after
// a write was sent -> idem.ErrUnknownOutcome.
func mapErr(err error, write bool) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
		return err
	}
	var me *mysql.MySQLError
	var op *net.OpError
	switch {
	case errors.As(err, &me) && me.Number == 1062:
		return fmt.Errorf("%w: mysqloutbox: %w", outbox.ErrDuplicateID, err)
	case errors.As(err, &me), errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone),
		errors.As(err, &op) && op.Op == "dial", !write:
		return fmt.Errorf("%w: mysqloutbox: %w", idem.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: mysqloutbox: %w", idem.ErrUnknownOutcome, err)
}
