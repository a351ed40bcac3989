package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// Purge implements idem.Purger: expired records of this namespace are
// deleted in statements of at most PurgeBatch rows (each its own short
// autocommit transaction, found through the (ns, state, expires_at) index),
// so no statement holds many row locks or a long undo log. With Archive,
// each batch is DELETE ... RETURNING plus an INSERT into the history table
// in one transaction.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	total := 0
	for _, t := range s.n.tables {
		for limit <= 0 || total < limit {
			b := s.cfg.PurgeBatch
			if limit > 0 {
				b = min(b, limit-total)
			}
			n, err := s.purgeBatch(ctx, t, b)
			total += n
			if err != nil {
				return total, err
			}
			if n < b {
				break
			}
			if err := ctxErr(ctx); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

func (s *Store) purgeWhere(table string, b int) string {
	return "FROM " + table + " WHERE ns = " + s.nsLit + " AND state IN (1,2,3,4) AND expires_at <= " + nowUS + " LIMIT " + strconv.Itoa(b)
}

// purgeBatch takes its connection apart from its statements (conn), like
// the claim path: behind a proxy in front of a stopped server the
// handshake's failure is ErrUnavailable, not the ErrUnknownOutcome a write
// statement's lost reply is.
func (s *Store) purgeBatch(ctx context.Context, table string, b int) (int, error) {
	var n int
	err := s.retry(ctx, true, func() error {
		c, err := s.conn(ctx)
		if err != nil {
			return err
		}
		defer c.Close()
		if s.cfg.Archive {
			n, err = s.archiveBatch(ctx, c, table, b)
			return err
		}
		res, err := c.ExecContext(ctx, "DELETE "+s.purgeWhere(table, b))
		if err != nil {
			return err
		}
		rows, err := res.RowsAffected()
		n = int(rows)
		return err
	})
	return n, mapErr(err, true)
}

// archiveCols are the columns copied to the history table.
func (s *Store) archiveCols() string {
	c := "ns, key_hash, k, state, token, nonce, fp, result, attempts, last_error, ttl_us, lease_until, expires_at, created_at, updated_at"
	if s.cfg.Layout.timed() {
		c = "key_time, " + c
	}
	return c
}

func (s *Store) archiveBatch(ctx context.Context, c *sql.Conn, table string, b int) (int, error) {
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	cols := s.archiveCols()
	rows, err := tx.QueryContext(ctx, "DELETE "+s.purgeWhere(table, b)+" RETURNING "+cols+", "+nowUS)
	if err != nil {
		return 0, err
	}
	ncol := len(strings.Split(cols, ",")) + 1
	var values []string
	for rows.Next() {
		vals := make([]any, ncol)
		ptrs := make([]any, ncol)
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			rows.Close()
			return 0, err
		}
		var sb strings.Builder
		sb.WriteByte('(')
		for i, v := range vals {
			if i > 0 {
				sb.WriteByte(',')
			}
			switch v := v.(type) {
			case nil:
				sb.WriteString("NULL")
			case []byte:
				hexLit(&sb, v)
			case int64:
				intLit(&sb, v)
			case uint64:
				uintLit(&sb, v)
			default:
				rows.Close()
				return 0, fmt.Errorf("mysqlstore: archive: unexpected column type %T", v)
			}
		}
		sb.WriteByte(')')
		values = append(values, sb.String())
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(values) == 0 {
		return 0, tx.Commit()
	}
	// IGNORE: a row archived twice (same key and token) stays archived once.
	if _, err := tx.ExecContext(ctx, "INSERT IGNORE INTO "+s.n.hist+" ("+cols+", archived_at) VALUES "+strings.Join(values, ",")); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return len(values), nil
}

// ListInProgress implements idem.Lister. Pages are ordered by
// (table, expires_at, key) through the (ns, state, expires_at) index; the
// cursor is "table.expires_at.[key_time.]key_hash".
func (s *Store) ListInProgress(ctx context.Context, cursor string, limit int) ([]idem.Record, string, error) {
	if err := s.check(ctx); err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		limit = 100
	}
	if limit > 10000 {
		return nil, "", fmt.Errorf("%w: list limit %d above 10000", idem.ErrInvalidArgument, limit)
	}
	start, after, err := s.parseCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	var out []idem.Record
	type pos struct {
		table int
		tail  string
	}
	var last []pos
	for ti := start; ti < len(s.n.tables) && len(out) <= limit; ti++ {
		order := "expires_at, key_hash"
		tuple := "(expires_at, key_hash)"
		sel := "expires_at, HEX(key_hash)"
		if s.cfg.Layout.timed() {
			order = "expires_at, key_time, key_hash"
			tuple = "(expires_at, key_time, key_hash)"
			sel = "expires_at, key_time, HEX(key_hash)"
		}
		q := "SELECT " + recCols + ", CONCAT_WS('.', " + sel + ") FROM " + s.n.tables[ti] +
			" WHERE ns = " + s.nsLit + " AND state = 1 AND expires_at > " + nowUS
		if ti == start && after != "" {
			q += " AND " + tuple + " > (" + after + ")"
		}
		q += " ORDER BY " + order + " LIMIT " + strconv.Itoa(limit+1-len(out))
		rows, err := s.db.QueryContext(ctx, q)
		if err != nil {
			return nil, "", mapErr(err, false)
		}
		for rows.Next() {
			var tail string
			rr, err := scanRow(rows, &tail)
			if err != nil {
				rows.Close()
				return nil, "", mapErr(err, false)
			}
			out = append(out, rr.rec)
			last = append(last, pos{ti, tail})
		}
		if err := rows.Err(); err != nil {
			return nil, "", mapErr(err, false)
		}
	}
	if len(out) <= limit {
		return out, "", nil
	}
	p := last[limit-1]
	return out[:limit], strconv.Itoa(p.table) + "." + p.tail, nil
}

// parseCursor checks a cursor and turns it into SQL literals: every part is
// a decimal integer or hex, so nothing else reaches the query.
func (s *Store) parseCursor(c string) (int, string, error) {
	if c == "" {
		return 0, "", nil
	}
	bad := fmt.Errorf("%w: mysqlstore: bad cursor %q", idem.ErrInvalidArgument, c)
	parts := strings.Split(c, ".")
	want := 3
	if s.cfg.Layout.timed() {
		want = 4
	}
	if len(parts) != want {
		return 0, "", bad
	}
	ti, err := strconv.Atoi(parts[0])
	if err != nil || ti < 0 || ti >= len(s.n.tables) {
		return 0, "", bad
	}
	var lits []string
	for _, p := range parts[1 : want-1] {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return 0, "", bad
		}
		lits = append(lits, strconv.FormatInt(v, 10))
	}
	h, err := hex.DecodeString(parts[want-1])
	if err != nil || len(h) != 16 {
		return 0, "", bad
	}
	lits = append(lits, hexStr(h))
	return ti, strings.Join(lits, ","), nil
}

// Stats implements idem.Stater: live records by state, counted through
// the (ns, state, expires_at) index.
func (s *Store) Stats(ctx context.Context) (idem.Stats, error) {
	if err := s.check(ctx); err != nil {
		return idem.Stats{}, err
	}
	var st idem.Stats
	for _, t := range s.n.tables {
		rows, err := s.db.QueryContext(ctx, "SELECT state, COUNT(*) FROM "+t+" WHERE ns = "+s.nsLit+" AND state IN (1,2,3,4) AND expires_at > "+nowUS+" GROUP BY state")
		if err != nil {
			return idem.Stats{}, mapErr(err, false)
		}
		for rows.Next() {
			var state int
			var n int64
			if err := rows.Scan(&state, &n); err != nil {
				rows.Close()
				return idem.Stats{}, mapErr(err, false)
			}
			switch state {
			case stInProgress:
				st.InProgress += n
			case stCompleted:
				st.Completed += n
			case stFailed:
				st.Failed += n
			case stReleased:
				st.Released += n
			}
		}
		if err := rows.Err(); err != nil {
			return idem.Stats{}, mapErr(err, false)
		}
	}
	return st, nil
}

// ---- partitions ----

type partition struct {
	name  string
	bound int64 // exclusive upper bound of key_time; -1 for MAXVALUE
}

func (s *Store) partitions(ctx context.Context, q querier) ([]partition, error) {
	rows, err := q.QueryContext(ctx, `SELECT PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND PARTITION_NAME IS NOT NULL ORDER BY PARTITION_ORDINAL_POSITION`, s.cfg.Table)
	if err != nil {
		return nil, mapErr(err, false)
	}
	defer rows.Close()
	var ps []partition
	for rows.Next() {
		var p partition
		var desc string
		if err := rows.Scan(&p.name, &desc); err != nil {
			return nil, mapErr(err, false)
		}
		if !identRE.MatchString(p.name) {
			return nil, fmt.Errorf("mysqlstore: unexpected partition name %q", p.name)
		}
		if desc == "MAXVALUE" {
			p.bound = -1
		} else if p.bound, err = strconv.ParseInt(desc, 10, 64); err != nil {
			return nil, fmt.Errorf("mysqlstore: partition %s bound %q: %w", p.name, desc, err)
		}
		ps = append(ps, p)
	}
	return ps, mapErr(rows.Err(), false)
}

var errNotPartitioned = fmt.Errorf("%w: mysqlstore: layout is not time_partitioned", idem.ErrInvalidArgument)

// maintLockWait bounds how long one maintenance call waits for another
// (from any Store value or process) to finish.
const maintLockWait = 60

// maintain runs fn on a connection of its own that holds the table's
// maintenance lock (GET_LOCK, server-wide): maintenance from several Store
// values or processes runs one call at a time, and each call reads the
// partitions as the previous one left them. Every DDL statement and LOCK
// TABLES on it waits at most LockTimeout for the table's metadata lock
// (lock_wait_timeout), so claims never queue long behind it. The connection
// is discarded afterwards instead of going back to the pool, so nothing fn
// left in the session (table locks, the named lock, the timeout) outlives
// the call.
func (s *Store) maintain(ctx context.Context, fn func(c *sql.Conn) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return mapErr(err, false)
	}
	defer conn.Raw(func(any) error { return driver.ErrBadConn }) // close it: see above
	var got sql.NullInt64
	lock := "'idem_maint_" + s.cfg.Table + "'" // Table is an identifier (Validate)
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lock+", "+strconv.Itoa(maintLockWait)+")").Scan(&got); err != nil {
		return mapErr(err, false)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("%w: mysqlstore: maintenance lock %s still held by another caller after %ds", idem.ErrUnavailable, lock, maintLockWait)
	}
	secs := int64((s.cfg.LockTimeout + time.Second - 1) / time.Second)
	if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = "+strconv.FormatInt(secs, 10)); err != nil {
		return mapErr(err, false)
	}
	return fn(conn)
}

// maintainPartitions runs fn under the maintenance lock (see maintain) with
// the database clock and the partitions as they are once the lock is held.
func (s *Store) maintainPartitions(ctx context.Context, fn func(c *sql.Conn, now int64, ps []partition) error) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if s.cfg.Layout != LayoutTimePartitioned {
		return errNotPartitioned
	}
	return s.maintain(ctx, func(c *sql.Conn) error {
		now, err := dbNow(ctx, c)
		if err != nil {
			return err
		}
		ps, err := s.partitions(ctx, c)
		if err != nil {
			return err
		}
		return fn(c, now, ps)
	})
}

// EnsurePartitions makes sure partitions exist up to Precreate periods
// ahead of the current one (database clock), splitting them off pmax. It
// returns how many it added. Run it at least once per period (the
// mysqlstore-migrate command has a partitions subcommand); keys beyond the
// last partition still land in pmax, so a missed run costs locality, never
// correctness. Splitting pmax copies its rows into the new partitions, so
// it may run at any time, concurrently with claims and with maintenance
// from other processes (one call at a time holds the maintenance lock).
func (s *Store) EnsurePartitions(ctx context.Context) (int, error) {
	added := 0
	err := s.maintainPartitions(ctx, func(c *sql.Conn, now int64, ps []partition) error {
		var lastBound int64
		for _, p := range ps {
			if p.bound > lastBound {
				lastBound = p.bound
			}
		}
		want := periodStart(s.cfg, time.UnixMicro(now))
		for i := 0; i <= s.cfg.Precreate; i++ {
			want = nextPeriod(s.cfg, want)
		}
		var defs []string
		b := time.UnixMicro(lastBound).UTC()
		for b.Before(want) {
			b = nextPeriod(s.cfg, b)
			defs = append(defs, partDef(b))
		}
		if len(defs) == 0 {
			return nil
		}
		defs = append(defs, "PARTITION pmax VALUES LESS THAN MAXVALUE")
		if _, err := c.ExecContext(ctx, "ALTER TABLE "+s.n.tables[0]+" REORGANIZE PARTITION pmax INTO ("+strings.Join(defs, ", ")+")"); err != nil {
			return mapErr(err, true)
		}
		added = len(defs) - 1
		s.cfg.Logger.InfoContext(ctx, "mysqlstore: partitions added", "table", s.cfg.Table, "count", added)
		return nil
	})
	return added, err
}

// DropExpiredPartitions drops whole partitions instead of deleting rows. A
// partition is a candidate once its end plus Retention has passed by the
// database clock; the catch-all pmax and the newest bounded partition never
// are. A candidate is dropped only if no row in it, of any namespace, is
// live, and that check and the drop happen under LOCK TABLES ... WRITE:
//
//   - taking the lock waits until every transaction that touched the table
//     has ended (a ClaimTx or DoTx of an old key committing now is seen by
//     the check), and
//   - while it is held nobody else reads or writes the table, so no claim
//     can land in the partition between the check and the DROP.
//
// So a record is never removed before its ExpiresAt, even a late claim of an
// old key that landed in an old partition, whatever runs concurrently.
// Claims of the table wait while the lock is held: the check is a loose scan
// of the by_state index and the DROP is a metadata operation, and waiting for
// the lock is bounded by LockTimeout (as the DROP's own metadata lock
// always was).
//
// With Archive the partition is first swapped, still under the lock, with
// the empty table <table>_swap (EXCHANGE PARTITION, a metadata operation),
// and after the lock is released its rows are copied to the history table:
// the history gets every row exactly as it was dropped, without copying a
// whole partition while claims wait. Rows a failed call left in
// <table>_swap are archived by the next call before it drops anything.
//
// It returns the dropped partitions.
func (s *Store) DropExpiredPartitions(ctx context.Context) ([]string, error) {
	var dropped []string
	err := s.maintainPartitions(ctx, func(c *sql.Conn, now int64, ps []partition) error {
		var cands []partition
		for i, p := range ps {
			if p.bound >= 0 && i < len(ps)-2 && p.bound+s.cfg.Retention.Microseconds() <= now {
				cands = append(cands, p)
			}
		}
		if len(cands) == 0 {
			return nil
		}
		if s.cfg.Archive {
			// The swap table must be empty before an exchange: archive and
			// clear whatever an interrupted call left there.
			if _, err := c.ExecContext(ctx, recordTableDDL(s.cfg, s.n.swap, "")); err != nil {
				return mapErr(err, true)
			}
			if err := s.archiveSwap(ctx, c); err != nil {
				return err
			}
		}
		for _, p := range cands {
			ok, err := s.dropIfExpired(ctx, c, p)
			if err != nil {
				return err
			}
			if ok {
				s.cfg.Logger.InfoContext(ctx, "mysqlstore: partition dropped", "table", s.cfg.Table, "partition", p.name)
				dropped = append(dropped, p.name)
			}
		}
		return nil
	})
	return dropped, err
}

// dropIfExpired drops p if none of its rows is live, deciding and dropping
// under LOCK TABLES (see DropExpiredPartitions).
func (s *Store) dropIfExpired(ctx context.Context, c *sql.Conn, p partition) (bool, error) {
	t := s.n.tables[0]
	locks := t + " WRITE"
	if s.cfg.Archive {
		locks += ", " + s.n.swap + " WRITE"
	}
	if _, err := c.ExecContext(ctx, "LOCK TABLES "+locks); err != nil {
		return false, mapErr(err, false)
	}
	// MAX(expires_at) per (ns, state): a loose scan of by_state, compared
	// with the clock now, while nobody else can change the table.
	var live int
	err := c.QueryRowContext(ctx, "SELECT COALESCE(MAX(m), 0) > "+nowUS+" FROM (SELECT MAX(expires_at) AS m FROM "+t+
		" PARTITION ("+p.name+") GROUP BY ns, state) x").Scan(&live)
	if err != nil {
		return false, mapErr(err, false)
	}
	if live == 0 {
		if s.cfg.Archive {
			if _, err := c.ExecContext(ctx, "ALTER TABLE "+t+" EXCHANGE PARTITION "+p.name+" WITH TABLE "+s.n.swap); err != nil {
				return false, mapErr(err, true)
			}
		}
		if _, err := c.ExecContext(ctx, "ALTER TABLE "+t+" DROP PARTITION "+p.name); err != nil {
			return false, mapErr(err, true)
		}
	}
	if _, err := c.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		return false, mapErr(err, true)
	}
	if live != 0 {
		return false, nil // a live record: keep the partition
	}
	if s.cfg.Archive {
		if err := s.archiveSwap(ctx, c); err != nil {
			return true, err
		}
	}
	return true, nil
}

// archiveSwap copies the rows of the swap table (a dropped partition's) to
// the history table and empties it. Nothing but maintenance, under its
// lock, touches the swap table, and INSERT IGNORE makes a repeat after a
// failure harmless.
func (s *Store) archiveSwap(ctx context.Context, c *sql.Conn) error {
	cols := s.archiveCols()
	if _, err := c.ExecContext(ctx, "INSERT IGNORE INTO "+s.n.hist+" ("+cols+", archived_at) SELECT "+cols+", "+nowUS+" FROM "+s.n.swap); err != nil {
		return mapErr(err, true)
	}
	if _, err := c.ExecContext(ctx, "TRUNCATE TABLE "+s.n.swap); err != nil {
		return mapErr(err, true)
	}
	return nil
}
