// Command mysqlstore-migrate applies the mysqlstore schema and runs its
// maintenance: partitions ahead, expired partitions dropped, purge.
//
//	mysqlstore-migrate -dsn 'root@tcp(127.0.0.1:3306)/test' [-table idem_records] \
//	    [-layout single|sharded|time_ordered|time_partitioned] [-shards 16] \
//	    [-keytime uuidv7|ulid|snowflake] [-period 24h] [-archive] \
//	    migrate | partitions | purge [-limit N] [-namespace NS]
//
// migrate is idempotent (a named lock serializes concurrent runs).
// partitions adds partitions ahead and drops expired ones (time_partitioned).
// purge deletes expired records of one namespace in small batches.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem/mysqlstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mysqlstore-migrate:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/test", "go-sql-driver/mysql DSN")
	table := flag.String("table", mysqlstore.DefaultTable, "record table")
	layout := flag.String("layout", "single", "single, sharded, time_ordered or time_partitioned")
	shards := flag.Int("shards", 0, "shards for the sharded layout (default 16)")
	keytime := flag.String("keytime", "uuidv7", "key time format for timed layouts: uuidv7, ulid, snowflake")
	epoch := flag.Int64("snowflake-epoch-ms", 1288834974657, "Snowflake epoch in Unix ms (default Twitter's)")
	period := flag.Duration("period", 24*time.Hour, "partition width: 24h or 168h")
	precreate := flag.Int("precreate", mysqlstore.DefaultPrecreate, "partitions kept ahead")
	retention := flag.Duration("retention", 8*24*time.Hour, "time after a partition's end before it may be dropped (>= TTL + lease)")
	archive := flag.Bool("archive", false, "copy purged rows and dropped partitions to <table>_history")
	ns := flag.String("namespace", "", "namespace for purge")
	limit := flag.Int("limit", 0, "purge at most this many records (0: all expired)")
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		return fmt.Errorf("want one command: migrate, partitions or purge")
	}
	l, err := mysqlstore.ParseLayout(*layout)
	if err != nil {
		return err
	}
	db, err := sql.Open("mysql", *dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg := mysqlstore.Config{DB: db, Table: *table, Layout: l, Shards: *shards, Period: *period,
		Precreate: *precreate, Retention: *retention, Archive: *archive, Namespace: *ns,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	switch *keytime {
	case "uuidv7":
		cfg.KeyTime = mysqlstore.UUIDv7KeyTime
	case "ulid":
		cfg.KeyTime = mysqlstore.ULIDKeyTime
	case "snowflake":
		cfg.KeyTime = mysqlstore.SnowflakeKeyTime(time.UnixMilli(*epoch))
	default:
		return fmt.Errorf("unknown -keytime %q", *keytime)
	}
	if l != mysqlstore.LayoutTimeOrdered && l != mysqlstore.LayoutTimePartitioned {
		cfg.KeyTime = nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	switch flag.Arg(0) {
	case "migrate":
		return mysqlstore.Migrate(ctx, cfg)
	case "partitions":
		s, err := mysqlstore.Open(ctx, cfg)
		if err != nil {
			return err
		}
		added, err := s.EnsurePartitions(ctx)
		if err != nil {
			return err
		}
		dropped, err := s.DropExpiredPartitions(ctx)
		fmt.Printf("added %d partitions, dropped %v\n", added, dropped)
		return err
	case "purge":
		s, err := mysqlstore.Open(ctx, cfg)
		if err != nil {
			return err
		}
		n, err := s.Purge(ctx, *limit)
		fmt.Printf("purged %d records\n", n)
		return err
	}
	return fmt.Errorf("unknown command %q", flag.Arg(0))
}
