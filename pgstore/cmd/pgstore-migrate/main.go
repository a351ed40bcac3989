// Command pgstore-migrate creates or upgrades a pgstore schema. It is
// idempotent: run it at every deploy.
//
//	go run ./cmd/pgstore-migrate -dsn postgres://postgres@127.0.0.1:5432/test \
//	    -schema idem -table idem_records -layout time_partitioned -keytime uuidv7
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pgstore-migrate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pgstore-migrate", flag.ContinueOnError)
	fs.SetOutput(out)
	dsn := fs.String("dsn", os.Getenv("DATABASE_URL"), "PostgreSQL connection string (default $DATABASE_URL)")
	schema := fs.String("schema", pgstore.DefaultSchema, "schema")
	table := fs.String("table", pgstore.DefaultTable, "table (prefix of shards, partitions and history)")
	layout := fs.String("layout", "single", "single, sharded, time_ordered or time_partitioned")
	shards := fs.Int("shards", pgstore.DefaultShards, "number of shards (sharded layout)")
	period := fs.String("period", "day", "partition width: day or week (time_partitioned)")
	precreate := fs.Int("precreate", pgstore.DefaultPrecreate, "future partitions to create (time_partitioned)")
	keytime := fs.String("keytime", "uuidv7", "key time format for timed layouts: uuidv7, ulid or snowflake")
	dropExpired := fs.Bool("drop-expired", false, "also drop partitions whose records have all expired (time_partitioned)")
	archive := fs.Bool("archive", false, "with -drop-expired: copy rows to <table>_history first")
	timeout := fs.Duration("timeout", 5*time.Minute, "overall timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dsn == "" {
		return fmt.Errorf("-dsn is required")
	}
	l, err := pgstore.ParseLayout(*layout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := pgstore.Config{Pool: pool, Schema: *schema, Table: *table, Layout: l, Precreate: *precreate, Archive: *archive}
	switch l {
	case pgstore.LayoutSharded:
		cfg.Shards = *shards
	case pgstore.LayoutTimeOrdered, pgstore.LayoutTimePartitioned:
		switch *keytime {
		case "uuidv7":
			cfg.KeyTime = pgstore.UUIDv7KeyTime
		case "ulid":
			cfg.KeyTime = pgstore.ULIDKeyTime
		case "snowflake":
			cfg.KeyTime = pgstore.SnowflakeKeyTime(time.Unix(0, 0)) // the key time is not used by migrations
		default:
			return fmt.Errorf("unknown -keytime %q", *keytime)
		}
		if l == pgstore.LayoutTimePartitioned {
			switch *period {
			case "day":
				cfg.Period = 24 * time.Hour
			case "week":
				cfg.Period = 7 * 24 * time.Hour
			default:
				return fmt.Errorf("unknown -period %q (day or week)", *period)
			}
		}
	}
	if err := pgstore.Migrate(ctx, cfg); err != nil {
		return err
	}
	s, err := pgstore.New(cfg)
	if err != nil {
		return err
	}
	if err := s.CheckSchema(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s.%s: schema version %d, layout %s\n", *schema, *table, pgstore.SchemaVersion, l)
	if *dropExpired && l == pgstore.LayoutTimePartitioned {
		dropped, err := s.DropExpiredPartitions(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "dropped %d expired partition(s): %v\n", len(dropped), dropped)
	}
	return nil
}
