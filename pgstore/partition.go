package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
)

// Time partitions (LayoutTimePartitioned).
//
// The parent is range-partitioned on key_time = KeyTime(key), one partition
// per Period, named <table>_pYYYYMMDD after its first day (UTC; weeks start
// on Monday). Because key_time is a function of the key, the unique key
// (ns, key_time, key_hash) is exactly as unique as the key, and every claim
// of a key lands in the same partition.
//
// Partitions are created ahead by Migrate/EnsurePartitions (Precreate
// periods) and on demand when a claim needs one that is missing (a key from
// the far past or future, or one whose partition was dropped).
//
// Retention (DropExpiredPartitions) drops a partition only when its range has
// ended AND, under an ACCESS EXCLUSIVE lock on it, no row in it has
// expires_at in the future. So a record is never dropped before its
// ExpiresAt, whatever its TTL, lease extensions or takeovers: retention is
// at least the TTL by construction rather than by configuration.

// periodStart returns the start of the period holding t.
func (s *Store) periodStart(t time.Time) time.Time {
	days := t.Unix() / 86400
	if t.Unix() < 0 && t.Unix()%86400 != 0 {
		days--
	}
	if s.cfg.Period == 7*24*time.Hour {
		// 1970-01-01 was a Thursday: (days+3) mod 7 is days since Monday.
		off := (days + 3) % 7
		if off < 0 {
			off += 7
		}
		days -= off
	}
	return time.Unix(days*86400, 0).UTC()
}

func (s *Store) partitionName(start time.Time) string {
	return fmt.Sprintf("%s_p%s", s.cfg.Table, start.Format("20060102"))
}

// ensurePartitionsFor makes sure the partitions for the keys' times exist,
// as far as this Store knows: it remembers the partitions it created or
// found, and another Store value (or process) may have dropped one since.
// A claim that then finds no partition calls recreatePartitions.
func (s *Store) ensurePartitionsFor(ctx context.Context, refs []keyRef) error {
	if s.cfg.Layout != LayoutTimePartitioned {
		return nil
	}
	var missing []time.Time
	s.partMu.Lock()
	for _, r := range refs {
		st := s.periodStart(r.ktime)
		if !s.parts[st.Unix()] && !slices.Contains(missing, st) {
			missing = append(missing, st)
		}
	}
	s.partMu.Unlock()
	for _, st := range missing {
		if err := s.createPartition(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// recreatePartitions is called after a statement found no partition for one
// of refs (SQLSTATE 23514): this Store's memory of them is stale (maintenance
// elsewhere dropped one), so it forgets them and creates whichever is
// missing.
func (s *Store) recreatePartitions(ctx context.Context, refs []keyRef) error {
	s.partMu.Lock()
	for _, r := range refs {
		delete(s.parts, s.periodStart(r.ktime).Unix())
	}
	s.partMu.Unlock()
	return s.ensurePartitionsFor(ctx, refs)
}

// errPartitionRecreated is wrapped in the error of a claim inside a
// caller's transaction that found its partition missing: the server aborted
// the transaction, pgstore recreated the partition, and running the
// transaction again succeeds (IsRetryable).
var errPartitionRecreated = errors.New("pgstore: the partition was missing (dropped by maintenance after this Store last used it) and has been recreated: run the transaction again")

// createPartition creates the partition starting at st if it does not exist.
// It creates a plain table and then attaches it: ATTACH PARTITION takes a
// SHARE UPDATE EXCLUSIVE lock on the parent, which claims in flight (ROW
// EXCLUSIVE) do not block, whereas CREATE TABLE ... PARTITION OF waits for
// ACCESS EXCLUSIVE, so it would wait for every open transaction that
// claimed, the caller's own (ClaimTx) included, and every claim behind it
// would wait too. An advisory lock serializes creators; lock_timeout bounds
// the wait for the parent's lock.
func (s *Store) createPartition(ctx context.Context, st time.Time) error {
	end := st.Add(s.cfg.Period)
	name := s.partitionName(st)
	P, parent := ident(s.cfg.Schema, name), ident(s.cfg.Schema, s.cfg.Table)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", s.cfg.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 1))", s.cfg.Schema+"."+s.cfg.Table); err != nil {
			return err
		}
		var attached bool
		err := tx.QueryRow(ctx, `SELECT c.relispartition FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, s.cfg.Schema, name).Scan(&attached)
		switch {
		case err == nil && attached:
			return nil
		case errors.Is(err, pgx.ErrNoRows):
			// A table left unattached by a crash between the two steps is
			// attached below.
			if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS)", P, parent)); err != nil {
				return err
			}
		case err != nil:
			return err
		}
		_, err = tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')",
			parent, P, st.Format(time.RFC3339), end.Format(time.RFC3339)))
		return err
	})
	if err != nil && pgCode(err) != codeDuplicateTable {
		return s.mapErr(ctx, fmt.Errorf("create partition %s: %w", name, err), false)
	}
	s.partMu.Lock()
	s.parts[st.Unix()] = true
	s.partMu.Unlock()
	return nil
}

// EnsurePartitions creates the partitions from the current period (database
// clock) through Precreate periods ahead, and reports how many it checked.
func (s *Store) EnsurePartitions(ctx context.Context) (int, error) {
	if s.cfg.Layout != LayoutTimePartitioned {
		return 0, nil
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	var now time.Time
	if err := s.pool.QueryRow(ctx, "SELECT statement_timestamp()").Scan(&now); err != nil {
		return 0, s.mapErr(ctx, err, false)
	}
	st := s.periodStart(now)
	n := 0
	for i := 0; i <= s.cfg.Precreate; i++ {
		if err := s.createPartition(ctx, st.Add(time.Duration(i)*s.cfg.Period)); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Partitions lists the partition names of the table, oldest first.
func (s *Store) Partitions(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE n.nspname = $1 AND p.relname = $2 ORDER BY c.relname`, s.cfg.Schema, s.cfg.Table)
	if err != nil {
		return nil, s.mapErr(ctx, err, false)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return names, s.mapErr(ctx, err, false)
}

// DropExpiredPartitions drops (after archiving them, if Config.Archive) the
// partitions whose time range has ended and that hold no live record. It
// returns the names dropped. Partitions still holding a record whose
// ExpiresAt is in the future are kept, and checked again on the next call.
// Records of every namespace share the partitions, so this is a table-wide
// operation, not one of this Store's namespace. It may run at any time,
// from any number of Store values and processes, beside claims: see
// dropPartition for the locking.
func (s *Store) DropExpiredPartitions(ctx context.Context) ([]string, error) {
	if s.cfg.Layout != LayoutTimePartitioned {
		return nil, fmt.Errorf("%w: pgstore: layout %s has no partitions", idem.ErrInvalidArgument, s.cfg.Layout)
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	if err := s.archiveDetached(ctx); err != nil {
		return nil, err
	}
	names, err := s.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	var now time.Time
	if err := s.pool.QueryRow(ctx, "SELECT statement_timestamp()").Scan(&now); err != nil {
		return nil, s.mapErr(ctx, err, false)
	}
	prefix := s.cfg.Table + "_p"
	var dropped []string
	for _, name := range names {
		st, err := time.Parse("20060102", strings.TrimPrefix(name, prefix))
		if err != nil || !strings.HasPrefix(name, prefix) {
			continue // not ours
		}
		if st.Add(s.cfg.Period).After(now) {
			continue // range not over yet
		}
		ok, err := s.dropPartition(ctx, name, st)
		if err != nil {
			return dropped, err
		}
		if ok {
			s.partMu.Lock()
			delete(s.parts, st.Unix())
			s.partMu.Unlock()
			dropped = append(dropped, name)
			s.cfg.Logger.Info("pgstore: dropped expired partition", "table", s.cfg.Schema+"."+name, "archived", s.cfg.Archive)
		}
	}
	return dropped, s.archiveDetached(ctx)
}

// detachedName is the name a partition takes between its detach and its
// archival (Config.Archive).
func (s *Store) detachedName(st time.Time) string {
	return fmt.Sprintf("%s_d%s", s.cfg.Table, st.Format("20060102"))
}

// dropPartition drops the partition name (starting at st) if it holds no
// live record, and reports whether it did.
//
// Locks are taken in the order claims and reads take them, the parent
// table first, then the partition (its rows are routed there): ACCESS
// EXCLUSIVE on the parent, then the check, then the drop, in one short
// transaction. Nothing can add or extend a record in the partition between
// the check and the drop. (Locking the partition first and the parent at
// DROP TABLE, as before, deadlocked with any claim or Get of a key in that
// partition: each held what the other waited for until deadlock_timeout.)
// Every statement on the table waits while the lock is held, so the
// transaction does no more than the check and catalog changes: with
// Archive, the partition is detached and renamed (<table>_dYYYYMMDD) there,
// and copied to the history table and dropped afterwards, outside the lock
// (archiveDetached). lock_timeout (Config.LockTimeout) bounds the wait for
// the parent's lock, behind which new statements queue: a table busy for
// longer is skipped, and tried again on the next call.
func (s *Store) dropPartition(ctx context.Context, name string, st time.Time) (bool, error) {
	P := ident(s.cfg.Schema, name)
	dropped := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", s.cfg.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+ident(s.cfg.Schema, s.cfg.Table)+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		var live bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+P+" WHERE expires_at > statement_timestamp())").Scan(&live); err != nil {
			return err
		}
		if live {
			return nil
		}
		stmts := []string{"DROP TABLE " + P}
		if s.cfg.Archive {
			stmts = []string{
				"ALTER TABLE " + ident(s.cfg.Schema, s.cfg.Table) + " DETACH PARTITION " + P,
				"ALTER TABLE " + P + " RENAME TO " + ident(s.detachedName(st)),
			}
		}
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		dropped = true
		return nil
	})
	if err != nil {
		if c := pgCode(err); c == codeLockNotAvailable || c == codeDeadlockDetected {
			s.cfg.Logger.Warn("pgstore: partition busy, will retry", "table", s.cfg.Schema+"."+name, "err", err)
			return false, nil
		}
		return false, s.mapErr(ctx, err, true)
	}
	return dropped, nil
}

// archiveDetached copies every detached partition (<table>_dYYYYMMDD: one
// whose detach committed, by this or another Store value, and whose copy
// has not) to the history table and drops it, each in one transaction.
// Nothing else uses a detached partition, so this blocks no claim.
func (s *Store) archiveDetached(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND NOT c.relispartition AND c.relname LIKE $2 ORDER BY c.relname`,
		s.cfg.Schema, strings.ReplaceAll(s.cfg.Table, "_", `\_`)+`\_d%`)
	if err != nil {
		return s.mapErr(ctx, err, false)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return s.mapErr(ctx, err, false)
	}
	for _, name := range names {
		if _, err := time.Parse("20060102", strings.TrimPrefix(name, s.cfg.Table+"_d")); err != nil {
			continue // not ours
		}
		D := ident(s.cfg.Schema, name)
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			// Another maintainer may be at it: the second finds it gone.
			if _, err := tx.Exec(ctx, "LOCK TABLE "+D+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+s.hist+" (ns, key_hash, key_time, "+rowCols+") SELECT ns, key_hash, key_time, "+rowCols+" FROM "+D); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+D)
			return err
		})
		if err != nil && pgCode(err) != codeUndefinedTable {
			return s.mapErr(ctx, fmt.Errorf("archive detached partition %s: %w", name, err), true)
		}
	}
	return nil
}
