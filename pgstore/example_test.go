package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Claim, effect and completion commit in one transaction: a redelivered
// message finds the record and replays the stored result.
func ExampleStore_DoTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	cfg := pgstore.Config{Pool: pool, Schema: "app", Table: "idem_records", Namespace: "payments"}
	if err := pgstore.Migrate(ctx, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	req := idem.ClaimRequest{Key: []byte("order-42"), Lease: 30 * time.Second, TTL: 7 * 24 * time.Hour}
	c, err := store.DoTx(ctx, req, func(ctx context.Context, tx pgx.Tx, c idem.Claim) ([]byte, error) {
		_, err := tx.Exec(ctx, "UPDATE app.orders SET paid = true WHERE id = 42")
		return []byte("paid"), err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Outcome == idem.OutcomeCompleted) // true on a redelivery
}

// Keys that carry their own time (here UUIDv7) can use the time-ordered
// layout: inserts append at the right edge of the index.
func ExampleConfig_timeOrdered() {
	cfg := pgstore.Config{
		Pool:    nil, // your *pgxpool.Pool
		Layout:  pgstore.LayoutTimeOrdered,
		KeyTime: pgstore.UUIDv7KeyTime,
	}
	fmt.Println(cfg.Validate() != nil) // the pool is missing
	// Output: true
}
