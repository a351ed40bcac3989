package pgoutbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
)

// SchemaVersion is the latest schema version Migrate applies.
const SchemaVersion = 1

// versionTable records, per outbox table, the applied schema version.
const versionTable = "idem_outbox_schema_version"

// migrations are applied in order; migrations[i] brings the schema to
// version i+1. Each is idempotent (IF NOT EXISTS), so a crash between DDL
// and the version update is harmless.
var migrations = []func(ctx context.Context, tx pgx.Tx, c Config) error{migrateV1}

func migrateV1(ctx context.Context, tx pgx.Tx, c Config) error {
	t := ident(c.Schema, c.Table)
	idx := func(suffix string) string { return ident(c.Table + suffix) }
	for _, s := range []string{
		// id is the primary key (the duplicate check and how settles find
		// rows). seq: an identity (CACHE 1, so sessions take values in
		// order) with no index of its own; the order of a key's messages,
		// never a cursor. status: 0 pending, 1 sent, 2 failed (seed 000's
		// values). Every index but the primary key and the due backlog is
		// partial on a state rows enter after enqueue, so an enqueue
		// writes two index entries (three with Ordered and a key).
		`CREATE TABLE IF NOT EXISTS ` + t + ` (
	seq bigint GENERATED ALWAYS AS IDENTITY,
	id text COLLATE "C" NOT NULL,
	topic text NOT NULL,
	key bytea NOT NULL DEFAULT '',
	headers bytea,
	payload bytea,
	status smallint NOT NULL DEFAULT 0,
	attempts integer NOT NULL DEFAULT 0,
	next_attempt_at timestamptz NOT NULL,
	created_at timestamptz NOT NULL,
	updated_at timestamptz NOT NULL,
	last_error text NOT NULL DEFAULT '',
	CONSTRAINT ` + idx("_pkey") + ` PRIMARY KEY (id)
)`,
		// Claims walk this: due pending rows in (next_attempt_at, seq)
		// order. Partial, so it holds the backlog only.
		`CREATE INDEX IF NOT EXISTS ` + idx("_due") + ` ON ` + t + ` (next_attempt_at, seq) WHERE status = 0`,
		// Retention deletes sent rows oldest first.
		`CREATE INDEX IF NOT EXISTS ` + idx("_sent") + ` ON ` + t + ` (updated_at) WHERE status = 1`,
		// Operators page through failed rows.
		`CREATE INDEX IF NOT EXISTS ` + idx("_failed") + ` ON ` + t + ` (seq) WHERE status = 2`,
	} {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgoutbox: migrate v1: %w", err)
		}
	}
	return nil
}

// ensureOrderedIndex makes, with Config.Ordered, the index ordered claims
// ask "is an earlier row of this key pending?"; Migrate runs it on every
// call, so Ordered can be turned on later.
func ensureOrderedIndex(ctx context.Context, tx pgx.Tx, c Config) error {
	if !c.Ordered {
		return nil
	}
	_, err := tx.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+ident(c.Table+"_key")+` ON `+ident(c.Schema, c.Table)+` (key, seq) WHERE status = 0 AND key <> ''`)
	return err
}

// Migrate creates or upgrades the outbox table for cfg. It is idempotent
// and safe to run from several processes at once (an advisory lock
// serializes them).
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c := cfg.withDefaults()
	err := pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "idem_outbox:"+c.Schema+"."+c.Table); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident(c.Schema)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ident(c.Schema, versionTable)+` (
	tbl text PRIMARY KEY,
	version integer NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
			return err
		}
		v, err := readVersion(ctx, tx, c)
		if err != nil {
			return err
		}
		if v > len(migrations) {
			return fmt.Errorf("pgoutbox: %s.%s is at schema version %d, newer than this code (%d)", c.Schema, c.Table, v, len(migrations))
		}
		for i := v; i < len(migrations); i++ {
			if err := migrations[i](ctx, tx, c); err != nil {
				return err
			}
		}
		if err := ensureOrderedIndex(ctx, tx, c); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+ident(c.Schema, versionTable)+` (tbl, version) VALUES ($1, $2)
ON CONFLICT (tbl) DO UPDATE SET version = EXCLUDED.version, applied_at = now()`, c.Table, len(migrations))
		return err
	})
	if err != nil {
		return fmt.Errorf("pgoutbox: migrate %s.%s: %w", c.Schema, c.Table, err)
	}
	return nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readVersion(ctx context.Context, q querier, c Config) (int, error) {
	var v int
	err := q.QueryRow(ctx, `SELECT version FROM `+ident(c.Schema, versionTable)+` WHERE tbl = $1`, c.Table).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return v, err
}

// CheckSchema reports an error unless the table is migrated to
// SchemaVersion.
func (o *Outbox) CheckSchema(ctx context.Context) error {
	v, err := readVersion(ctx, o.pool, o.cfg)
	if err != nil {
		return o.mapErr(err, false)
	}
	if v != SchemaVersion {
		return fmt.Errorf("%w: pgoutbox: %s.%s is at schema version %d, want %d (run Migrate)", idem.ErrUnavailable, o.cfg.Schema, o.cfg.Table, v, SchemaVersion)
	}
	return nil
}
