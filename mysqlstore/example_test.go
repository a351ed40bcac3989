package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/mysqlstore"
)

// exampleDB makes a throwaway database for an example and returns a pool
// on it and a function that drops it.
func exampleDB() (*sql.DB, func()) {
	var t fakeTB
	_, db := newDB(&t)
	return db, t.cleanup
}

func Example() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	cfg := mysqlstore.Config{DB: db, Namespace: "billing"}
	if err := mysqlstore.Migrate(ctx, cfg); err != nil { // idempotent
		panic(err)
	}
	s, err := mysqlstore.Open(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer s.Close()

	req := idem.ClaimRequest{Key: []byte("msg-42"), Lease: 30 * time.Second, TTL: 24 * time.Hour}
	c, _ := s.Claim(ctx, req)
	fmt.Println(c.Outcome)
	_ = s.Complete(ctx, req.Key, c.Record.Token, []byte("charged"))
	c, _ = s.Claim(ctx, req)
	fmt.Println(c.Outcome, string(c.Record.Result))
	// Output:
	// acquired
	// completed charged
}

// DoTx commits the effect and the idempotency record together.
func ExampleStore_DoTx() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	cfg := mysqlstore.Config{DB: db}
	if err := mysqlstore.Migrate(ctx, cfg); err != nil {
		panic(err)
	}
	s, _ := mysqlstore.Open(ctx, cfg)
	defer s.Close()
	if _, err := db.Exec("CREATE TABLE payments (msg VARBINARY(64), amount INT)"); err != nil {
		panic(err)
	}
	pay := func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
		_, err := tx.ExecContext(ctx, "INSERT INTO payments VALUES ('msg-7', 100)")
		return []byte("paid 100"), err
	}
	req := idem.ClaimRequest{Key: []byte("msg-7"), Lease: time.Minute, TTL: 24 * time.Hour}
	for i := 0; i < 3; i++ { // the broker delivers the message three times
		c, err := s.DoTx(ctx, req, pay)
		fmt.Println(c.Outcome, string(c.Record.Result), err)
	}
	var n int
	_ = db.QueryRow("SELECT COUNT(*) FROM payments").Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// acquired paid 100 <nil>
	// completed paid 100 <nil>
	// completed paid 100 <nil>
	// payments: 1
}

// A batch consumer claims a whole poll in one statement.
func ExampleStore_ClaimBatch() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	cfg := mysqlstore.Config{DB: db}
	_ = mysqlstore.Migrate(ctx, cfg)
	s, _ := mysqlstore.Open(ctx, cfg)
	defer s.Close()
	r := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Lease: time.Minute, TTL: time.Hour}
	}
	res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{r("a"), r("b"), r("a"), r("")})
	if err != nil {
		panic(err)
	}
	for _, x := range res {
		if x.Err != nil {
			fmt.Println("error:", x.Err)
			continue
		}
		fmt.Println(x.Claim.Outcome)
	}
	// Output:
	// acquired
	// acquired
	// in_progress
	// error: idem: invalid key: empty key
}

func ExampleStore_CompleteBatch() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	cfg := mysqlstore.Config{DB: db}
	_ = mysqlstore.Migrate(ctx, cfg)
	s, _ := mysqlstore.Open(ctx, cfg)
	defer s.Close()
	var cs []idem.Completion
	for _, k := range []string{"a", "b"} {
		c, _ := s.Claim(ctx, idem.ClaimRequest{Key: []byte(k), Lease: time.Minute, TTL: time.Hour})
		cs = append(cs, idem.Completion{Key: []byte(k), Token: c.Record.Token, Result: []byte("ok-" + k)})
	}
	cs = append(cs, idem.Completion{Key: []byte("a"), Token: cs[0].Token + 1000}) // not the holder
	errs, err := s.CompleteBatch(ctx, cs)                                         // one statement
	if err != nil {
		panic(err) // the call failed as a whole; retrying is safe
	}
	for i, e := range errs {
		fmt.Println(string(cs[i].Key), errors.Is(e, idem.ErrFenced))
	}
	r, _ := s.Get(ctx, []byte("a"))
	fmt.Println(r.State, string(r.Result))
	// Output:
	// a false
	// b false
	// a true
	// completed ok-a
}

// A batch consumer's own transaction around ClaimBatchTx and CompleteTx:
// BeginTx makes it one in which no effect commits without its record, even
// if a statement is retried after InnoDB rolled the transaction back.
func ExampleStore_BeginTx() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	cfg := mysqlstore.Config{DB: db}
	_ = mysqlstore.Migrate(ctx, cfg)
	s, _ := mysqlstore.Open(ctx, cfg)
	defer s.Close()
	if _, err := db.Exec("CREATE TABLE shipped (msg VARBINARY(64))"); err != nil {
		panic(err)
	}
	poll := []idem.ClaimRequest{
		{Key: []byte("m1"), Lease: time.Minute, TTL: time.Hour},
		{Key: []byte("m2"), Lease: time.Minute, TTL: time.Hour},
	}
	run := func() error {
		tx, err := s.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		res, err := s.ClaimBatchTx(ctx, tx.Tx, poll)
		if err != nil {
			return err
		}
		for i, r := range res {
			if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
				continue // a duplicate: ack it without running the effect
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO shipped VALUES (?)", poll[i].Key); err != nil {
				return err
			}
			if err := s.CompleteTx(ctx, tx.Tx, poll[i].Key, r.Claim.Record.Token, nil); err != nil {
				return err
			}
		}
		return tx.Commit() // ErrTxEnded (IsRetryable) if the server rolled it back on the way
	}
	for i := 0; i < 2; i++ { // the same poll delivered twice
		if err := run(); err != nil {
			panic(err)
		}
	}
	var n int
	_ = db.QueryRow("SELECT COUNT(*) FROM shipped").Scan(&n)
	fmt.Println("shipped:", n)
	// Output:
	// shipped: 2
}

// The consumer's transactional batch mode: one transaction per batch claims
// the messages' keys, inserts the new orders and completes them; a message
// whose effect fails for good is left out of the batch's effect, its key
// marked failed in the same transaction and the message dead-lettered.
func ExampleTxBatchHandler() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	cfg := mysqlstore.Config{DB: db, Namespace: "orders"}
	if err := mysqlstore.Migrate(ctx, cfg); err != nil {
		panic(err)
	}
	store, _ := mysqlstore.Open(ctx, cfg)
	defer store.Close()
	if _, err := db.Exec("CREATE TABLE orders (id VARCHAR(64), body BLOB)"); err != nil {
		panic(err)
	}
	handler, err := mysqlstore.TxBatchHandler(store, mysqlstore.TxHandlerConfig{TTL: 7 * 24 * time.Hour},
		func(ctx context.Context, tx *sql.Tx, msgs []*broker.Message) ([][]byte, error) {
			failed := map[int]error{}
			for i, m := range msgs {
				if len(m.Payload) == 0 {
					failed[i] = idem.Permanent(errors.New("empty order"))
					continue
				}
				if _, err := tx.ExecContext(ctx, "INSERT INTO orders VALUES (?, ?)", m.ID, m.Payload); err != nil {
					return nil, err // rolls the whole batch back
				}
			}
			if len(failed) > 0 {
				return nil, &consumer.PartialError{Failed: failed}
			}
			return nil, nil
		})
	if err != nil {
		panic(err)
	}
	guard, _ := idem.NewGuard(store)
	defer guard.Close()
	b, _ := membroker.New(membroker.Config{})
	pub := b.NewPublisher()
	a := &broker.Message{ID: "order-1", Topic: "orders", Payload: []byte(`{"total":10}`)}
	_ = pub.Publish(ctx, a, &broker.Message{ID: "order-2", Topic: "orders"}, a) // order-1 twice
	c, _ := consumer.New(consumer.Config{
		Subscriber:     b.NewSubscriber("orders", "order-service"),
		Guard:          guard, // not used for claims in this mode
		TxBatchHandler: handler,
		DeadLetter:     pub,
	})
	rctx, stop := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- c.Run(rctx) }()
	for s := c.Stats(); s.Handled+s.Duplicates+s.DeadLettered < 3; s = c.Stats() {
		time.Sleep(time.Millisecond)
	}
	stop()
	<-stopped
	var n int
	_ = db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n)
	rec, _ := store.Get(ctx, []byte("order-2"))
	fmt.Println("orders:", n, "order-2:", rec.State, "dead letters:", len(b.Published("orders.dead-letter")))
	// Output: orders: 1 order-2: failed dead letters: 1
}
