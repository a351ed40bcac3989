package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/memoutbox"
)

// A message written in the business transaction, then relayed to the
// broker. With PostgreSQL the transaction is a pgx.Tx
// (pgoutbox.Outbox.Enqueue), with MariaDB a *sql.Tx (mysqloutbox), with the
// embedded store a *bbolt.Tx (boltoutbox); a relay process runs Relay.Run.
func Example() {
	ctx := context.Background()
	ob := memoutbox.New(memoutbox.Config{})
	mb, _ := membroker.New(membroker.Config{})

	tx := ob.Begin() // the business transaction
	// ... the business change ...
	if _, err := tx.Enqueue(ctx, outbox.Message{ID: "order-42-created", Topic: "orders", Key: []byte("order-42"), Payload: []byte(`{"total":99}`)}); err != nil {
		tx.Rollback()
		return
	}
	_ = tx.Commit()

	relay, err := outbox.New(outbox.Config{
		Backend:   ob,
		Publisher: mb.NewPublisher(),
		Hooks: outbox.Hooks{OnFailed: func(ctx context.Context, e outbox.FailedEvent) {
			fmt.Println("ALERT: message", e.Row.ID, "failed:", e.Err) // page someone
		}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	n, _ := relay.RunOnce(ctx) // a relay process calls relay.Run(ctx) instead
	fmt.Println("relayed:", n)
	for _, m := range mb.Published("orders") {
		fmt.Println(m.ID, string(m.Payload))
	}
	st, _ := ob.Stats(ctx)
	fmt.Println("pending:", st.Pending)
	// Output:
	// relayed: 1
	// order-42-created {"total":99}
	// pending: 0
}
