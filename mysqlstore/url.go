package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storeurl"
)

// URLConfig is a store configuration read from a URL by FromURL: the
// driver's connection settings and the store's. Adjust either, then call
// Open (or Migrate).
type URLConfig struct {
	// Driver is the go-sql-driver/mysql configuration the URL maps onto
	// (see FromURL); mysql.NewConnector takes it.
	Driver *mysql.Config
	// Store holds the store's settings; Open sets Store.DB.
	Store Config
	// MaxOpenConns and MaxIdleConns size the *sql.DB Open makes (0:
	// database/sql's defaults, no limit and 2).
	MaxOpenConns, MaxIdleConns int
}

// FromURL reads a store configuration from a mysql:// URL, as the idem
// command's --store flag takes it. A MySQL DSN is not a URL; the mapping
// is:
//
//	mysql://user:password@host:port/dbname?params
//	  -> user:password@tcp(host:port)/dbname?params   (port 3306 by default)
//	mysql://user:password@/dbname?socket=/run/mysqld/mysqld.sock
//	  -> user:password@unix(/run/mysqld/mysqld.sock)/dbname
//	mysql:///dbname -> tcp(127.0.0.1:3306), the driver's default address
//
// User and password are percent-decoded; the database is the whole path
// after the first '/'. The store's own parameters are namespace, table,
// version_table, layout (single, sharded, time_ordered,
// time_partitioned), shards, period (day or week), precreate, retention,
// archive, keytime (uuidv7, ulid, snowflake), snowflake_epoch,
// purge_batch, max_batch, single_statement, tx_retries, lock_wait,
// maintenance_lock_timeout (Config.LockTimeout), max_open_conns and
// max_idle_conns. Every other parameter is the driver's DSN parameter of
// the same name (tls, timeout, readTimeout, collation, ...; one it does not
// know is a system variable set on each connection, as the driver does).
func FromURL(rawURL string) (*URLConfig, error) {
	u, q, err := storeurl.Parse("mysqlstore", rawURL, "mysql")
	if err != nil {
		return nil, err
	}
	uc := &URLConfig{}
	c := &uc.Store
	var layout, socket string
	q.String("namespace", &c.Namespace)
	q.String("table", &c.Table)
	q.String("version_table", &c.VersionTable)
	q.Choice("layout", &layout, "single", "sharded", "time_ordered", "time_partitioned")
	q.Int("shards", &c.Shards, 2, 256)
	q.Period("period", &c.Period)
	q.Int("precreate", &c.Precreate, 0, 366)
	q.Duration("retention", &c.Retention)
	q.Bool("archive", &c.Archive)
	q.Int("purge_batch", &c.PurgeBatch, 1, 100000)
	q.Int("max_batch", &c.MaxBatch, 1, 10000)
	q.Bool("single_statement", &c.SingleStatement)
	q.Int("tx_retries", &c.TxRetries, 0, 100)
	q.Duration("lock_wait", &c.LockWait)
	q.Duration("maintenance_lock_timeout", &c.LockTimeout)
	q.Int("max_open_conns", &uc.MaxOpenConns, 0, 1<<20)
	q.Int("max_idle_conns", &uc.MaxIdleConns, 0, 1<<20)
	q.String("socket", &socket)
	c.KeyTime = q.KeyTime()
	if err := q.Err(); err != nil {
		return nil, err
	}
	if layout != "" {
		c.Layout, _ = ParseLayout(layout)
	}

	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: mysqlstore: URL %s: "+format, append([]any{idem.ErrInvalidArgument, u.Redacted()}, a...)...)
	}
	d := mysql.NewConfig()
	if u.User != nil {
		d.User = u.User.Username()
		d.Passwd, _ = u.User.Password()
	}
	d.DBName = strings.TrimPrefix(u.Path, "/")
	if strings.Contains(d.DBName, "/") {
		return nil, bad("database name %q has a '/'", d.DBName)
	}
	switch {
	case socket != "" && u.Host != "":
		return nil, bad("give a host or a socket, not both")
	case socket != "":
		d.Net, d.Addr = "unix", socket
	case u.Host != "":
		d.Net, d.Addr = "tcp", u.Host
		if u.Port() == "" {
			d.Addr = net.JoinHostPort(u.Hostname(), "3306")
		}
	}
	// The driver parses and checks its own parameters: hand it a DSN made
	// of the fields above (escaped by FormatDSN) and the remaining query.
	dsn := d.FormatDSN()
	if rest := q.Rest(); len(rest) > 0 {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + rest.Encode()
	}
	if uc.Driver, err = mysql.ParseDSN(dsn); err != nil {
		return nil, bad("%v", err)
	}
	return uc, uc.Validate()
}

// Validate reports a configuration error (wrapping idem.ErrInvalidArgument).
func (c *URLConfig) Validate() error {
	if c.Driver == nil {
		return fmt.Errorf("%w: mysqlstore: URLConfig.Driver is nil", idem.ErrInvalidArgument)
	}
	s := c.Store
	if s.DB == nil {
		s.DB = new(sql.DB) // Validate only checks that there is one
	}
	return s.Validate()
}

// Pool makes the connection pool (no I/O until first use), for callers
// that open several Stores on it (one per namespace): the caller closes it.
func (c *URLConfig) Pool() (*sql.DB, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(c.Driver)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqlstore: %v", idem.ErrInvalidArgument, err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(c.MaxOpenConns)
	if c.MaxIdleConns > 0 {
		db.SetMaxIdleConns(c.MaxIdleConns)
	}
	return db, nil
}

// Open makes the connection pool and opens the Store on it (Open checks
// the schema: run Migrate first on a new database). Closing the Store
// closes the pool.
func (c *URLConfig) Open(ctx context.Context) (*Store, error) {
	db, err := c.Pool()
	if err != nil {
		return nil, err
	}
	cfg := c.Store
	cfg.DB = db
	s, err := Open(ctx, cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.ownDB = true
	return s, nil
}

// Migrate applies the schema (see Migrate) on a pool of its own, closed
// before it returns.
func (c *URLConfig) Migrate(ctx context.Context) error {
	db, err := c.Pool()
	if err != nil {
		return err
	}
	defer db.Close()
	cfg := c.Store
	cfg.DB = db
	return classifyError(Migrate(ctx, cfg))
}
