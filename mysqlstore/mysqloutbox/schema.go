package mysqloutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
)

// SchemaVersion is the latest schema version Migrate applies.
const SchemaVersion = 1

// Migrate creates or upgrades the outbox table for cfg. It is idempotent
// and safe to run from several processes at once (a named lock serializes
// them).
func Migrate(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c := cfg.withDefaults()
	conn, err := c.DB.Conn(ctx)
	if err != nil {
		return mapErr(err, false)
	}
	defer conn.Close()
	lock := "idem_outbox_migrate_" + c.Table
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lock, 60).Scan(&got); err != nil {
		return mapErr(err, false)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("%w: mysqloutbox: migrate lock %q busy", idem.ErrUnavailable, lock)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", lock)
	exec := func(q string) error {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("mysqloutbox: migrate: %w\n%s", mapErr(err, true), q)
		}
		return nil
	}
	if err := exec("CREATE TABLE IF NOT EXISTS " + quote(c.VersionTable) + ` (
  table_name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
  version INT NOT NULL,
  applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`); err != nil {
		return err
	}
	ver, err := readVersion(ctx, conn, c)
	if err != nil {
		return err
	}
	if ver > SchemaVersion {
		return fmt.Errorf("%w: mysqloutbox: table %s is at version %d, this code knows %d", idem.ErrInvalidArgument, c.Table, ver, SchemaVersion)
	}
	if ver < 1 {
		// Times are BIGINT microseconds since the Unix epoch from the
		// database clock (no DATETIME time zone or parseTime questions).
		// status: 0 pending, 1 sent, 2 failed (seed 000's values). InnoDB
		// has no partial indexes: each index leads with status, and a
		// secondary index ends with the primary key (seq) implicitly.
		if err := exec("CREATE TABLE IF NOT EXISTS " + quote(c.Table) + ` (
  seq BIGINT NOT NULL AUTO_INCREMENT COMMENT 'enqueue order; never a cursor',
  id VARBINARY(128) NOT NULL,
  topic VARBINARY(255) NOT NULL,
  k VARBINARY(512) NOT NULL,
  headers MEDIUMBLOB NULL,
  payload MEDIUMBLOB NULL,
  status TINYINT UNSIGNED NOT NULL DEFAULT 0 COMMENT '0 pending 1 sent 2 failed',
  attempts INT UNSIGNED NOT NULL DEFAULT 0,
  next_attempt_at BIGINT NOT NULL COMMENT 'us since epoch, DB clock',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  last_error VARBINARY(1024) NOT NULL DEFAULT '',
  PRIMARY KEY (seq),
  UNIQUE KEY uk_id (id),
  KEY due (status, next_attempt_at, seq),
  KEY sent (status, updated_at)
) ENGINE=InnoDB`); err != nil {
			return err
		}
	}
	if c.Ordered {
		// Ordered claims ask "is an earlier row of this key pending?".
		if err := exec("CREATE INDEX IF NOT EXISTS by_key ON " + quote(c.Table) + " (status, k, seq)"); err != nil {
			return err
		}
	}
	if ver < SchemaVersion {
		if _, err := conn.ExecContext(ctx, "INSERT INTO "+quote(c.VersionTable)+" (table_name, version, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE version = VALUES(version), applied_at = VALUES(applied_at)",
			c.Table, SchemaVersion); err != nil {
			return mapErr(err, true)
		}
		c.Logger.InfoContext(ctx, "mysqloutbox: migrated", "table", c.Table, "from", ver, "to", SchemaVersion)
	}
	return nil
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func readVersion(ctx context.Context, q queryRower, c Config) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, "SELECT version FROM "+quote(c.VersionTable)+" WHERE table_name = ?", c.Table).Scan(&v)
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, sql.ErrNoRows), errors.As(err, &me) && me.Number == 1146: // no row, no table
		return 0, nil
	case err != nil:
		return 0, mapErr(err, false)
	}
	return v, nil
}

// CheckSchema reports an error unless the table is migrated to
// SchemaVersion.
func (o *Outbox) CheckSchema(ctx context.Context) error {
	v, err := readVersion(ctx, o.db, o.cfg)
	if err != nil {
		return err
	}
	if v != SchemaVersion {
		return fmt.Errorf("%w: mysqloutbox: %s is at schema version %d, want %d (run Migrate)", idem.ErrUnavailable, o.cfg.Table, v, SchemaVersion)
	}
	return nil
}
