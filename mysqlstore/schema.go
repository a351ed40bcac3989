package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// SchemaVersion is the schema version this package writes and expects.
const SchemaVersion = 1

// ErrSchema: the table is missing, at another version, or was created with
// another layout. Run Migrate (or the mysqlstore-migrate command).
var ErrSchema = errors.New("mysqlstore: schema not migrated or does not match the config")

// names holds the quoted identifiers derived from a Config.
type names struct {
	tables  []string // record tables: one, or one per shard
	seq     string   // token sequence
	hist    string   // history table
	swap    string   // empty twin of a partition, for DropExpiredPartitions with Archive
	version string   // version table
	base    string   // unquoted Table
}

func namesOf(c Config) names {
	n := names{
		seq:     quoteIdent(c.Table + "_token"),
		hist:    quoteIdent(c.Table + "_history"),
		swap:    quoteIdent(c.Table + "_swap"),
		version: quoteIdent(c.VersionTable),
		base:    c.Table,
	}
	if c.Layout == LayoutSharded {
		for i := 0; i < c.Shards; i++ {
			n.tables = append(n.tables, quoteIdent(fmt.Sprintf("%s_%02d", c.Table, i)))
		}
	} else {
		n.tables = []string{quoteIdent(c.Table)}
	}
	return n
}

// columns of a record table. Times are BIGINT microseconds since the Unix
// epoch, from the database clock: no DATETIME time-zone or DSN parseTime
// questions, and plain integer arithmetic for leases.
func recordColumns(timed bool) string {
	var sb strings.Builder
	sb.WriteString("  ns VARBINARY(64) NOT NULL,\n")
	if timed {
		sb.WriteString("  key_time BIGINT NOT NULL COMMENT 'KeyTime(k), us since epoch',\n")
	}
	sb.WriteString(`  key_hash BINARY(16) NOT NULL COMMENT 'SHA-256(k)[:16]',
  k VARBINARY(1024) NOT NULL,
  state TINYINT UNSIGNED NOT NULL COMMENT '1 in_progress 2 completed 3 failed 4 released',
  token BIGINT UNSIGNED NOT NULL,
  nonce BIGINT UNSIGNED NOT NULL COMMENT 'random id of the claim that set token',
  fp VARBINARY(64) NOT NULL,
  result MEDIUMBLOB NULL,
  attempts INT UNSIGNED NOT NULL,
  last_error VARBINARY(1024) NOT NULL,
  ttl_us BIGINT NOT NULL,
  lease_until BIGINT NOT NULL COMMENT 'us since epoch, DB clock',
  expires_at BIGINT NOT NULL COMMENT 'us since epoch, DB clock',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
`)
	return sb.String()
}

func recordTableDDL(c Config, tbl string, partitions string) string {
	timed := c.Layout.timed()
	pk := "PRIMARY KEY (ns, key_hash)"
	if timed {
		pk = "PRIMARY KEY (ns, key_time, key_hash)"
	}
	return "CREATE TABLE IF NOT EXISTS " + tbl + " (\n" + recordColumns(timed) +
		"  " + pk + ",\n  KEY by_state (ns, state, expires_at)\n) ENGINE=InnoDB" + partitions
}

func historyTableDDL(c Config, tbl string) string {
	return "CREATE TABLE IF NOT EXISTS " + tbl + " (\n" + recordColumns(c.Layout.timed()) +
		"  archived_at BIGINT NOT NULL,\n  PRIMARY KEY (ns, key_hash, token),\n  KEY by_archived (archived_at)\n) ENGINE=InnoDB"
}

// Migrate creates or upgrades the schema for cfg: the version table, the
// token sequence, the record table(s) (with partitions for
// LayoutTimePartitioned) and, with Archive, the history table. It is
// idempotent and safe to run from several processes at once (a named lock
// serializes them). It refuses to change the layout of an existing table.
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c := cfg.withDefaults()
	n := namesOf(c)
	conn, err := c.DB.Conn(ctx)
	if err != nil {
		return mapErr(err, false)
	}
	defer conn.Close()
	lock := "idem_migrate_" + c.Table
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lock, 60).Scan(&got); err != nil {
		return mapErr(err, false)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("%w: mysqlstore: migrate lock %q busy", idem.ErrUnavailable, lock)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", lock)

	exec := func(q string) error {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("mysqlstore: migrate: %w\n%s", mapErr(err, true), q)
		}
		return nil
	}
	if err := exec("CREATE TABLE IF NOT EXISTS " + n.version + ` (
  table_name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
  version INT NOT NULL,
  layout VARCHAR(32) CHARACTER SET ascii NOT NULL,
  shards INT NOT NULL,
  applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`); err != nil {
		return err
	}
	ver, layout, shards, err := readVersion(ctx, conn, n, c.Table)
	if err != nil {
		return err
	}
	if ver > 0 && (layout != c.Layout.String() || shards != c.Shards) {
		return fmt.Errorf("%w: table %s has layout %s/%d shards, config says %s/%d", ErrSchema, c.Table, layout, shards, c.Layout, c.Shards)
	}
	if ver > SchemaVersion {
		return fmt.Errorf("%w: table %s is at version %d, this code knows %d", ErrSchema, c.Table, ver, SchemaVersion)
	}
	if ver < 1 {
		// Version 1: sequence and record tables. A per-table sequence gives
		// tokens that only grow, across expiry, purge and delete; NEXTVAL is
		// not transactional, so a rolled-back claim leaves a gap, never a reuse.
		if err := exec("CREATE SEQUENCE IF NOT EXISTS " + n.seq + " START WITH 1 INCREMENT BY 1 CACHE 1000 NOCYCLE"); err != nil {
			return err
		}
		parts := ""
		if c.Layout == LayoutTimePartitioned {
			now, err := dbNow(ctx, conn)
			if err != nil {
				return err
			}
			parts = "\nPARTITION BY RANGE (key_time) (" + initialPartitions(c, now) + ")"
		}
		for _, t := range n.tables {
			if err := exec(recordTableDDL(c, t, parts)); err != nil {
				return err
			}
		}
	}
	if c.Archive {
		if err := exec(historyTableDDL(c, n.hist)); err != nil {
			return err
		}
	}
	if ver < SchemaVersion {
		if _, err := conn.ExecContext(ctx, "INSERT INTO "+n.version+" (table_name, version, layout, shards, applied_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE version = VALUES(version), applied_at = VALUES(applied_at)",
			c.Table, SchemaVersion, c.Layout.String(), c.Shards); err != nil {
			return mapErr(err, true)
		}
		c.Logger.InfoContext(ctx, "mysqlstore: migrated", "table", c.Table, "from", ver, "to", SchemaVersion, "layout", c.Layout.String())
	}
	return nil
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func readVersion(ctx context.Context, q queryRower, n names, table string) (ver int, layout string, shards int, err error) {
	err = q.QueryRowContext(ctx, "SELECT version, layout, shards FROM "+n.version+" WHERE table_name = ?", table).Scan(&ver, &layout, &shards)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", 0, nil
	}
	if err != nil {
		if isServerErr(err, 1146) { // version table missing
			return 0, "", 0, nil
		}
		return 0, "", 0, mapErr(err, false)
	}
	return ver, layout, shards, nil
}

// checkSchema is run by Open: the version row must match the config.
func checkSchema(ctx context.Context, c Config, n names) error {
	ver, layout, shards, err := readVersion(ctx, c.DB, n, c.Table)
	if err != nil {
		return err
	}
	if ver != SchemaVersion || layout != c.Layout.String() || shards != c.Shards {
		return fmt.Errorf("%w: table %s: version %d layout %q shards %d; want version %d layout %q shards %d (run Migrate)",
			ErrSchema, c.Table, ver, layout, shards, SchemaVersion, c.Layout, c.Shards)
	}
	if c.Archive {
		var one int
		err := c.DB.QueryRowContext(ctx, "SELECT 1 FROM "+n.hist+" LIMIT 0").Scan(&one)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: history table: %v (run Migrate with Archive)", ErrSchema, err)
		}
	}
	return nil
}

func dbNow(ctx context.Context, q queryRower) (int64, error) {
	var now int64
	if err := q.QueryRowContext(ctx, "SELECT "+nowUS).Scan(&now); err != nil {
		return 0, mapErr(err, false)
	}
	return now, nil
}

// periodStart is the start (UTC) of the period holding t.
func periodStart(c Config, t time.Time) time.Time {
	t = t.UTC()
	d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	if c.Period == 7*24*time.Hour {
		wd := (int(d.Weekday()) + 6) % 7 // Monday = 0
		d = d.AddDate(0, 0, -wd)
	}
	return d
}

func nextPeriod(c Config, t time.Time) time.Time {
	if c.Period == 7*24*time.Hour {
		return t.AddDate(0, 0, 7)
	}
	return t.AddDate(0, 0, 1)
}

// partition names carry their exclusive upper bound: p_lt_20261130 holds
// key_time < 2026-11-30T00:00Z. The first one also holds every older key.
func partName(bound time.Time) string { return "p_lt_" + bound.Format("20060102") }

func partDef(bound time.Time) string {
	return "PARTITION " + partName(bound) + " VALUES LESS THAN (" + strconv.FormatInt(bound.UnixMicro(), 10) + ")"
}

// initialPartitions: everything before the current period, the current
// period, Precreate future ones and the catch-all pmax.
func initialPartitions(c Config, nowUs int64) string {
	start := periodStart(c, time.UnixMicro(nowUs))
	defs := []string{partDef(start)}
	b := start
	for i := 0; i <= c.Precreate; i++ {
		b = nextPeriod(c, b)
		defs = append(defs, partDef(b))
	}
	defs = append(defs, "PARTITION pmax VALUES LESS THAN MAXVALUE")
	return strings.Join(defs, ",\n ")
}
