package pgstore

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Layout selects how records are spread over tables.
type Layout uint8

const (
	// LayoutSingle: one table, unique on (ns, key_hash). Works for any key.
	LayoutSingle Layout = iota
	// LayoutSharded: Shards tables <table>_00.., routed by the key hash.
	// Keeps each table and index smaller; does not fix random-insert WAL cost.
	LayoutSharded
	// LayoutTimeOrdered: one table, unique on (ns, key_time, key_hash) where
	// key_time = KeyTime(key). New keys append at the right edge of the index.
	LayoutTimeOrdered
	// LayoutTimePartitioned: declarative range partitions on key_time (one
	// per Period), unique on (ns, key_time, key_hash). Retention drops whole
	// partitions once every record in them has expired.
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

// timed reports whether the layout keys rows on key_time.
func (l Layout) timed() bool { return l == LayoutTimeOrdered || l == LayoutTimePartitioned }

// Defaults.
const (
	DefaultSchema      = "public"
	DefaultTable       = "idem_records"
	DefaultShards      = 16
	DefaultPeriod      = 24 * time.Hour
	DefaultPurgeBatch  = 1000
	DefaultTxRetries   = 5
	DefaultLockTimeout = 2 * time.Second
	DefaultPrecreate   = 2
	// DefaultCommitIdleTimeout and DefaultResolveTimeout: see Config.
	DefaultCommitIdleTimeout = 2 * time.Second
	DefaultResolveTimeout    = 10 * time.Second
)

// Config configures a Store. Pool is required; everything else has a default.
type Config struct {
	// Pool is the connection pool. The Store does not close it.
	Pool *pgxpool.Pool
	// Schema and Table name the table (or the shard/partition prefix).
	// Letters, digits and '_' only; Table at most 40 bytes so that shard,
	// partition and history suffixes fit PostgreSQL's 63-byte identifiers.
	Schema, Table string
	// Namespace isolates this Store's records from others on the same table.
	Namespace string
	// Layout selects single, sharded, time-ordered or time-partitioned.
	Layout Layout
	// Shards is the number of tables for LayoutSharded (2..256, default 16).
	Shards int
	// KeyTime extracts the time carried by a key (UUIDv7, ULID, Snowflake).
	// Required for the timed layouts; a key it rejects gets ErrInvalidKey
	// before any SQL runs. It must be a pure function of the key.
	KeyTime KeyTimeFunc
	// Period is the partition width for LayoutTimePartitioned: 24h (day) or
	// 168h (ISO week, starting Monday UTC). Default a day.
	Period time.Duration
	// Precreate is how many future partitions Migrate and DropExpired keep
	// ready (default 2). Partitions missing at claim time are created on demand.
	Precreate int
	// Archive copies purged rows and dropped partitions into <table>_history
	// before removing them.
	Archive bool
	// PurgeBatch is the number of rows each purge statement deletes (default
	// 1000): small, so no statement holds row locks for long.
	PurgeBatch int
	// TxRetries bounds DoTx retries after serialization failures and
	// deadlocks (default 5).
	TxRetries int
	// LockTimeout bounds how long partition maintenance waits for its lock,
	// so claims never queue behind it for longer (default 2s).
	LockTimeout time.Duration
	// CommitIdleTimeout is the idle_in_transaction_session_timeout DoTx
	// sets on its transaction after its last statement, just before COMMIT
	// (default 2s): if the COMMIT is lost on the way, the server ends the
	// transaction by itself within this time, so DoTx can learn its fate.
	// Only a process stalled longer than this between the two (which the
	// server then sees as a lost client) turns a good DoTx into a rolled
	// back one (ErrUnavailable, safe to run again).
	CommitIdleTimeout time.Duration
	// ResolveTimeout bounds how long DoTx keeps asking the server about a
	// COMMIT whose answer was lost before it gives up with
	// idem.ErrUnknownOutcome (default 10s; above CommitIdleTimeout).
	ResolveTimeout time.Duration
	// Logger receives maintenance and retry messages (default slog.Default()).
	Logger *slog.Logger
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// withDefaults returns a copy with defaults filled in.
func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
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
	if c.PurgeBatch == 0 {
		c.PurgeBatch = DefaultPurgeBatch
	}
	if c.TxRetries == 0 {
		c.TxRetries = DefaultTxRetries
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.CommitIdleTimeout == 0 {
		c.CommitIdleTimeout = DefaultCommitIdleTimeout
	}
	if c.ResolveTimeout == 0 {
		c.ResolveTimeout = DefaultResolveTimeout
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
		return fmt.Errorf("%w: pgstore: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
	}
	if c.Pool == nil {
		return bad("Pool is required")
	}
	if !identRE.MatchString(c.Schema) || len(c.Schema) > 63 {
		return bad("schema %q: use letters, digits and '_' (at most 63)", c.Schema)
	}
	if !identRE.MatchString(c.Table) || len(c.Table) > 40 {
		return bad("table %q: use letters, digits and '_' (at most 40)", c.Table)
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
	if c.TxRetries < 0 || c.TxRetries > 100 {
		return bad("tx retries %d outside [0, 100]", c.TxRetries)
	}
	if c.LockTimeout < time.Millisecond {
		return bad("lock timeout %s below 1ms", c.LockTimeout)
	}
	if c.CommitIdleTimeout < 10*time.Millisecond || c.CommitIdleTimeout > time.Hour {
		return bad("commit idle timeout %s outside [10ms, 1h]", c.CommitIdleTimeout)
	}
	if c.ResolveTimeout <= c.CommitIdleTimeout {
		return bad("resolve timeout %s must exceed the commit idle timeout %s", c.ResolveTimeout, c.CommitIdleTimeout)
	}
	return nil
}
