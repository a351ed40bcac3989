package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
)

// SchemaVersion is the latest schema version Migrate applies.
const SchemaVersion = 1

// versionTable records, per record table, the applied schema version and the
// layout it was created with, so a Store configured with another layout
// refuses to run against it.
const versionTable = "idem_schema_version"

func ident(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// recordColumns is the column list shared by record and history tables.
func recordColumnsDDL(timed, history bool) string {
	var b strings.Builder
	b.WriteString(`ns text COLLATE "C" NOT NULL,
	key_hash bytea NOT NULL,
`)
	if timed || history {
		if history {
			b.WriteString("\tkey_time timestamptz,\n")
		} else {
			b.WriteString("\tkey_time timestamptz NOT NULL,\n")
		}
	}
	b.WriteString(`	token bigint NOT NULL,
	lease_until timestamptz NOT NULL,
	expires_at timestamptz NOT NULL,
	created_at timestamptz NOT NULL,
	updated_at timestamptz NOT NULL,
	ttl_us bigint NOT NULL,
	attempts integer NOT NULL,
	state smallint NOT NULL,
	key bytea NOT NULL,
	fingerprint bytea NOT NULL DEFAULT '',
	last_error text NOT NULL DEFAULT '',
	result bytea`)
	return b.String()
}

// recordTables returns the unquoted names of the tables holding records
// (the partitioned parent for LayoutTimePartitioned).
func (c Config) recordTables() []string {
	if c.Layout == LayoutSharded {
		out := make([]string, c.Shards)
		for i := range out {
			out[i] = fmt.Sprintf("%s_s%03d", c.Table, i)
		}
		return out
	}
	return []string{c.Table}
}

func (c Config) historyTable() string { return c.Table + "_history" }
func (c Config) sequence() string     { return c.Table + "_token_seq" }

func (c Config) pkCols() string {
	if c.Layout.timed() {
		return "ns, key_time, key_hash"
	}
	return "ns, key_hash"
}

// migrations are applied in order; migrations[i] brings the schema to
// version i+1. Each must be idempotent on its own (IF NOT EXISTS), so a
// crash between DDL and the version update is harmless.
var migrations = []func(ctx context.Context, tx pgx.Tx, c Config) error{
	migrateV1,
}

func migrateV1(ctx context.Context, tx pgx.Tx, c Config) error {
	timed := c.Layout.timed()
	// CACHE 1 (the default) is required: per-session caches would hand out
	// tokens out of order across sessions.
	stmts := []string{fmt.Sprintf("CREATE SEQUENCE IF NOT EXISTS %s AS bigint CACHE 1", ident(c.Schema, c.sequence()))}
	for _, t := range c.recordTables() {
		part := ""
		if c.Layout == LayoutTimePartitioned {
			part = " PARTITION BY RANGE (key_time)"
		}
		stmts = append(stmts,
			fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n\t%s,\n\tCONSTRAINT %s PRIMARY KEY (%s)\n)%s",
				ident(c.Schema, t), recordColumnsDDL(timed, false), ident(t+"_pkey"), c.pkCols(), part),
			// Purge walks this index; expires_at grows with time, so it is
			// appended at its right edge. expires_at leads so that no
			// lookup by (ns, key) is ever tempted to use it (with stale
			// statistics on ns, PostgreSQL picked (ns, expires_at) for key
			// probes and scanned a whole namespace).
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (expires_at, ns)", ident(t+"_expires_idx"), ident(c.Schema, t)))
	}
	stmts = append(stmts,
		fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n\t%s,\n\tarchived_at timestamptz NOT NULL DEFAULT statement_timestamp()\n)",
			ident(c.Schema, c.historyTable()), recordColumnsDDL(false, true)),
		fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (ns, key_hash)", ident(c.historyTable()+"_key_idx"), ident(c.Schema, c.historyTable())))
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgstore: migrate v1: %w", err)
		}
	}
	return nil
}

// Migrate creates or upgrades the schema for cfg. It is idempotent and safe
// to run from several processes at once (an advisory lock serializes them).
// For LayoutTimePartitioned it also creates the partitions around now.
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c := cfg.withDefaults()
	err := pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", c.Schema+"."+c.Table); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident(c.Schema)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	tbl text PRIMARY KEY,
	version integer NOT NULL,
	layout text NOT NULL,
	shards integer NOT NULL,
	period_s bigint NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`, ident(c.Schema, versionTable))); err != nil {
			return err
		}
		v, err := readVersion(ctx, tx, c)
		if err != nil {
			return err
		}
		if v > len(migrations) {
			return fmt.Errorf("pgstore: %s.%s is at schema version %d, newer than this code (%d)", c.Schema, c.Table, v, len(migrations))
		}
		for i := v; i < len(migrations); i++ {
			if err := migrations[i](ctx, tx, c); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (tbl, version, layout, shards, period_s) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tbl) DO UPDATE SET version = EXCLUDED.version, applied_at = now()`, ident(c.Schema, versionTable)),
			c.Table, len(migrations), c.Layout.String(), c.Shards, periodSeconds(c))
		return err
	})
	if err != nil {
		return fmt.Errorf("pgstore: migrate %s.%s: %w", c.Schema, c.Table, err)
	}
	if c.Layout == LayoutTimePartitioned {
		s, err := New(cfg)
		if err != nil {
			return err
		}
		if _, err := s.EnsurePartitions(ctx); err != nil {
			return err
		}
	}
	return nil
}

func periodSeconds(c Config) int64 {
	if c.Layout != LayoutTimePartitioned {
		return 0
	}
	return int64(c.Period / time.Second)
}

// readVersion returns the applied version (0: none) and checks that the
// table was made for the same layout.
func readVersion(ctx context.Context, q querier, c Config) (int, error) {
	var v, shards int
	var layout string
	var period int64
	err := q.QueryRow(ctx, fmt.Sprintf("SELECT version, layout, shards, period_s FROM %s WHERE tbl = $1", ident(c.Schema, versionTable)), c.Table).
		Scan(&v, &layout, &shards, &period)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if layout != c.Layout.String() || shards != c.Shards || period != periodSeconds(c) {
		return 0, fmt.Errorf("%w: pgstore: %s.%s was created as layout=%s shards=%d period=%ds; config says layout=%s shards=%d period=%ds",
			idem.ErrInvalidArgument, c.Schema, c.Table, layout, shards, period, c.Layout, c.Shards, periodSeconds(c))
	}
	return v, nil
}

// CheckSchema reports an error unless the schema is migrated to
// SchemaVersion for this Store's layout.
func (s *Store) CheckSchema(ctx context.Context) error {
	v, err := readVersion(ctx, s.pool, s.cfg)
	if err != nil {
		return s.mapErr(ctx, err, false)
	}
	if v != SchemaVersion {
		return fmt.Errorf("%w: pgstore: %s.%s is at schema version %d, want %d (run Migrate or pgstore-migrate)", idem.ErrUnavailable, s.cfg.Schema, s.cfg.Table, v, SchemaVersion)
	}
	// A commit the server acknowledged before its WAL was flushed can be
	// lost in a crash: a claim or completion lost so lets an effect run
	// twice. Say so (this session's settings; the pool's others share them
	// unless set per connection).
	var syncCommit, fsync string
	if err := s.pool.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('fsync')").Scan(&syncCommit, &fsync); err != nil {
		return s.mapErr(ctx, err, false)
	}
	if syncCommit == "off" || fsync == "off" {
		s.cfg.Logger.Warn("pgstore: commits are not durable: a crash can lose acknowledged claims and completions, and an effect then runs twice (see docs/pgstore.md, Durability)",
			"synchronous_commit", syncCommit, "fsync", fsync)
	}
	return nil
}

// Migrate applies the schema for this Store's configuration.
func (s *Store) Migrate(ctx context.Context) error { return Migrate(ctx, s.orig) }
