package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
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

// A consumer whose effect (an order row) lives in the same PostgreSQL as
// the idempotency records: each message's claim, effect and completion
// commit in one transaction, so a message published twice, or redelivered
// after a crash anywhere, takes effect once.
func ExampleTxHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn()) // e.g. postgres://app@db/orders
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("example_txhandler_%d", time.Now().UnixNano())
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	cfg := pgstore.Config{Pool: pool, Schema: schema, Table: "idem_records", Namespace: "orders"}
	if err := pgstore.Migrate(ctx, cfg); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id text, body text)"); err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.NewGuard(store)
	if err != nil {
		log.Fatal(err)
	}
	defer guard.Close()

	handler, err := pgstore.TxHandler(store, pgstore.TxHandlerConfig{TTL: 7 * 24 * time.Hour},
		func(ctx context.Context, tx pgx.Tx, m *broker.Message) ([]byte, error) {
			_, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders VALUES ($1, $2)", m.ID, m.Payload)
			return nil, err // a driver error as it is: an unreachable database holds the message
		})
	if err != nil {
		log.Fatal(err)
	}
	b, _ := membroker.New(membroker.Config{}) // natsbroker, kafkabroker... in production
	m := &broker.Message{ID: "order-42", Topic: "orders", Payload: []byte(`{"total":10}`)}
	_ = b.NewPublisher().Publish(ctx, m, m) // published twice
	c, err := consumer.New(consumer.Config{
		Subscriber: b.NewSubscriber("orders", "order-service"),
		Guard:      guard, // not used for claims in this mode
		TxHandler:  handler,
	})
	if err != nil {
		log.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(rctx) }()
	for c.Stats().Handled+c.Stats().Duplicates < 2 {
		time.Sleep(time.Millisecond)
	}
	stop()
	<-done
	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".orders").Scan(&n)
	fmt.Println("orders:", n, "duplicates:", c.Stats().Duplicates)
	// Output: orders: 1 duplicates: 1
}
