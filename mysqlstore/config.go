package mysqlstore

import (
	"database/sql"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/idem-dev/idem"
)

// Layout selects how records are spread over tables. The names and meanings
// match pgstore's.
type Layout uint8

const (
	// LayoutSingle: one table, primary key (ns, key_hash). Works for any key.
	LayoutSingle Layout = iota
	// LayoutSharded: Shards tables <table>_00.., routed by the key hash.
	LayoutSharded
	// LayoutTimeOrdered: one table, primary key (ns, key_time, key_hash)
	// where key_time = KeyTime(key): new keys append at the right edge of
	// the clustered index instead of landing on random pages.
	LayoutTimeOrdered
	// LayoutTimePartitioned: LayoutTimeOrdered plus RANGE partitions on
	// key_time (one per Period). Retention drops whole partitions once every
	// record in them has expired.
	LayoutTimePartitioned
)

func (l Layout) String() string {
	switch l {
	case LayoutSingle:
		return "single"
	case LayoutSharded:
		return "sharded"
	case LayoutTimeOrdered:
		return "time_ordered"
	case LayoutTimePartitioned:
		return "time_partitioned"
	}
	return fmt.Sprintf("layout(%d)", uint8(l))
}

// ParseLayout is the inverse of Layout.String.
func ParseLayout(s string) (Layout, error) {
	for l := LayoutSingle; l <= LayoutTimePartitioned; l++ {
		if l.String() == s {
			return l, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown layout %q (single, sharded, time_ordered, time_partitioned)", idem.ErrInvalidArgument, s)
}

func (l Layout) timed() bool { return l == LayoutTimeOrdered || l == LayoutTimePartitioned }

// Defaults.
const (
	DefaultTable        = "idem_records"
	DefaultVersionTable = "idem_schema_versions"
	DefaultShards       = 16
	DefaultPeriod       = 24 * time.Hour
	DefaultPrecreate    = 2
	DefaultPurgeBatch   = 1000
	DefaultTxRetries    = 5
	DefaultMaxBatch     = 1000
	DefaultLockTimeout  = 2 * time.Second
)

// Config configures a Store. DB is required; everything else has a default.
type Config struct {
	// DB is the connection pool (github.com/go-sql-driver/mysql). The Store
	// does not close it. No DSN option is required: the store sends its
	// statements as text with hex literals, so each call is one round trip
	// whatever interpolateParams says.
	DB *sql.DB
	// Table names the record table (also the prefix of the shard tables,
	// the token sequence <table>_token and the <table>_history table).
	// Letters, digits and '_' only, at most 48 bytes.
	Table string
	// VersionTable records the applied schema version of each table
	// (default idem_schema_versions).
	VersionTable string
	// Namespace isolates this Store's records from others on the same table.
	Namespace string
	// Layout selects single, sharded, time-ordered or time-partitioned.
	Layout Layout
	// Shards is the number of tables for LayoutSharded (2..256, default 16).
	Shards int
	// KeyTime extracts the time carried by a key (UUIDv7KeyTime,
	// ULIDKeyTime, SnowflakeKeyTime). Required for the timed layouts; a key
	// it rejects gets ErrInvalidKey before any SQL runs. It must be a pure
	// function of the key.
	KeyTime KeyTimeFunc
	// Period is the partition width for LayoutTimePartitioned: 24h (day) or
	// 168h (week, Monday UTC). Default a day.
	Period time.Duration
	// Precreate is how many future partitions Migrate and
	// EnsurePartitions keep ready (default 2). Keys past the last one go
	// to the catch-all partition pmax.
	Precreate int
	// Retention is how long after a partition's end DropExpiredPartitions
	// waits before it even looks at the partition (default 8 days, at least
	// 1m). Set it to at least the longest TTL plus the longest lease the
	// application uses; the drop also checks that no record in the
	// partition is still live, so a short Retention costs a scan, not data.
	Retention time.Duration
	// Archive copies purged rows and dropped partitions into
	// <table>_history before removing them.
	Archive bool
	// PurgeBatch is the number of rows each purge statement deletes (default
	// 1000): small, so no statement holds row locks for long.
	PurgeBatch int
	// MaxBatch is the most rows one claim statement carries (default 1000);
	// larger batches are split into several statements.
	MaxBatch int
	// SingleStatement sends every claim as one INSERT ... ON DUPLICATE KEY
	// UPDATE ... RETURNING (always one round trip). By default a claim is
	// first tried as INSERT IGNORE ... RETURNING, which is about twice as
	// fast for new keys, and only keys that already have a row take the
	// second, conditional statement.
	SingleStatement bool
	// TxRetries bounds retries after deadlocks (1213), in standalone calls
	// and in DoTx (default 5).
	TxRetries int
	// LockWait bounds how long a claim waits for a row locked by another
	// transaction (a concurrent DoTx on the same key) before it reports the
	// key in progress; 0 keeps the server's innodb_lock_wait_timeout.
	LockWait time.Duration
	// LockTimeout bounds how long partition maintenance waits for the
	// metadata lock, so claims never queue behind an ALTER for long
	// (default 2s).
	LockTimeout time.Duration
	// Logger receives maintenance and retry messages (default slog.Default()).
	Logger *slog.Logger
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.VersionTable == "" {
		c.VersionTable = DefaultVersionTable
	}
	if c.Layout == LayoutSharded && c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.Precreate == 0 {
		c.Precreate = DefaultPrecreate
	}
	if c.Retention == 0 {
		c.Retention = 8 * 24 * time.Hour
	}
	if c.PurgeBatch == 0 {
		c.PurgeBatch = DefaultPurgeBatch
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.TxRetries == 0 {
		c.TxRetries = DefaultTxRetries
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks the configuration (after defaults are applied).
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: mysqlstore: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
	}
	if c.DB == nil {
		return bad("DB is required")
	}
	if !identRE.MatchString(c.Table) || len(c.Table) > 48 {
		return bad("table %q: use letters, digits and '_' (at most 48)", c.Table)
	}
	if !identRE.MatchString(c.VersionTable) || len(c.VersionTable) > 64 {
		return bad("version table %q: use letters, digits and '_' (at most 64)", c.VersionTable)
	}
	if err := idem.ValidateNamespace(c.Namespace); err != nil {
		return err
	}
	switch c.Layout {
	case LayoutSingle, LayoutTimeOrdered:
	case LayoutSharded:
		if c.Shards < 2 || c.Shards > 256 {
			return bad("shards %d outside [2, 256]", c.Shards)
		}
	case LayoutTimePartitioned:
		if c.Period != 24*time.Hour && c.Period != 7*24*time.Hour {
			return bad("period %s: use 24h (day) or 168h (week)", c.Period)
		}
		if c.Precreate < 0 || c.Precreate > 366 {
			return bad("precreate %d outside [0, 366]", c.Precreate)
		}
		if c.Retention < time.Minute {
			return bad("retention %s below 1m", c.Retention)
		}
	default:
		return bad("unknown layout %d", c.Layout)
	}
	if c.Layout.timed() && c.KeyTime == nil {
		return bad("layout %s needs KeyTime (the time must be a function of the key)", c.Layout)
	}
	if c.Layout != LayoutSharded && c.Shards != 0 {
		return bad("shards set but layout is %s", c.Layout)
	}
	if c.PurgeBatch < 1 || c.PurgeBatch > 100000 {
		return bad("purge batch %d outside [1, 100000]", c.PurgeBatch)
	}
	if c.MaxBatch < 1 || c.MaxBatch > 10000 {
		return bad("max batch %d outside [1, 10000]", c.MaxBatch)
	}
	if c.TxRetries < 0 || c.TxRetries > 100 {
		return bad("tx retries %d outside [0, 100]", c.TxRetries)
	}
	if c.LockWait < 0 || c.LockWait > time.Hour {
		return bad("lock wait %s outside [0, 1h]", c.LockWait)
	}
	if c.LockTimeout < time.Second {
		return bad("lock timeout %s below 1s (MariaDB counts lock_wait_timeout in seconds)", c.LockTimeout)
	}
	return nil
}
