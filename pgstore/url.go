package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storeurl"
)

// URLConfig is a store configuration read from a URL by FromURL: pgx's
// connection and pool settings and the store's. Adjust either, then call
// Open (or Migrate).
type URLConfig struct {
	// Pool is the pool configuration, as pgxpool.ParseConfig made it from
	// the URL without the store's parameters.
	Pool *pgxpool.Config
	// Store holds the store's settings; Open sets Store.Pool.
	Store Config
}

// FromURL reads a store configuration from a postgres:// or postgresql://
// URL, as the idem command's --store flag takes it:
//
//	postgres://user:password@host:5432/db?sslmode=require&pool_max_conns=20&namespace=orders&layout=sharded&shards=32
//
// The store's own parameters are namespace, schema, table, layout (single,
// sharded, time_ordered, time_partitioned), shards, period (day or week),
// precreate, archive, keytime (uuidv7, ulid, snowflake; required by the
// timed layouts), snowflake_epoch (RFC 3339, default 2020-01-01Z),
// purge_batch, tx_retries, maintenance_lock_timeout (Config.LockTimeout:
// lock_timeout is PostgreSQL's own setting), commit_idle_timeout and
// resolve_timeout. Every other parameter is pgx's (sslmode, connect_timeout,
// pool_max_conns, ...; an unknown one is sent to the server as a run-time
// setting, as pgx does).
func FromURL(rawURL string) (*URLConfig, error) {
	u, q, err := storeurl.Parse("pgstore", rawURL, "postgres", "postgresql")
	if err != nil {
		return nil, err
	}
	var c Config
	var layout string
	q.String("namespace", &c.Namespace)
	q.String("schema", &c.Schema)
	q.String("table", &c.Table)
	q.Choice("layout", &layout, "single", "sharded", "time_ordered", "time_partitioned")
	q.Int("shards", &c.Shards, 2, 256)
	q.Period("period", &c.Period)
	q.Int("precreate", &c.Precreate, 0, 366)
	q.Bool("archive", &c.Archive)
	q.Int("purge_batch", &c.PurgeBatch, 1, 100000)
	q.Int("tx_retries", &c.TxRetries, 0, 100)
	q.Duration("maintenance_lock_timeout", &c.LockTimeout)
	q.Duration("commit_idle_timeout", &c.CommitIdleTimeout)
	q.Duration("resolve_timeout", &c.ResolveTimeout)
	c.KeyTime = q.KeyTime()
	if err := q.Err(); err != nil {
		return nil, err
	}
	if layout != "" {
		c.Layout, _ = ParseLayout(layout)
	}
	u.RawQuery = q.Rest().Encode()
	pc, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		// pgx's message names the URL with its password masked.
		return nil, fmt.Errorf("%w: pgstore: %v", idem.ErrInvalidArgument, err)
	}
	uc := &URLConfig{Pool: pc, Store: c}
	return uc, uc.Validate()
}

// Validate reports a configuration error (wrapping idem.ErrInvalidArgument).
func (c *URLConfig) Validate() error {
	if c.Pool == nil {
		return fmt.Errorf("%w: pgstore: URLConfig.Pool is nil", idem.ErrInvalidArgument)
	}
	s := c.Store
	if s.Pool == nil {
		s.Pool = new(pgxpool.Pool) // Validate only checks that there is one
	}
	return s.Validate()
}

// Open makes the pool (pgxpool.NewWithConfig: it connects lazily) and
// returns the Store on it; closing the Store closes the pool. Run Migrate
// first on a new database.
func (c *URLConfig) Open(ctx context.Context) (*Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, c.Pool)
	if err != nil {
		return nil, fmt.Errorf("%w: pgstore: %w", idem.ErrUnavailable, err)
	}
	cfg := c.Store
	cfg.Pool = pool
	s, err := New(cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// Migrate applies the schema (see Migrate) on a pool of its own, closed
// before it returns.
func (c *URLConfig) Migrate(ctx context.Context) error {
	s, err := c.Open(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	return s.ClassifyError(Migrate(ctx, s.orig))
}
