package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
)

// A message published twice takes effect once: the duplicate is acked
// without running the handler.
func Example() {
	b, _ := membroker.New(membroker.Config{})
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store)
	defer guard.Close()

	pub := b.NewPublisher()
	m := &broker.Message{ID: "order-1/pay", Topic: "orders", Payload: []byte(`{"amount":10}`)}
	_ = pub.Publish(context.Background(), m, m) // a producer retry

	charged := make(chan string, 2)
	c, err := consumer.New(consumer.Config{
		Subscriber: b.NewSubscriber("orders", "billing"),
		Guard:      guard,
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			charged <- m.ID // the effect
			return []byte("ok"), nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	for c.Stats().Handled+c.Stats().Duplicates < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	fmt.Println("charged:", len(charged), "duplicates:", c.Stats().Duplicates)
	// Output: charged: 1 duplicates: 1
}

// Keys from the payload: a business id plus an operation type.
func ExampleJSONBusinessKey() {
	key := consumer.JSONBusinessKey("order_id", "type")
	k, _ := key(&broker.Message{Payload: []byte(`{"order_id":"o-42","type":"refund","ts":1}`)})
	fmt.Println(string(k))
	// Output: refund:o-42
}

// A batch handler writes each effect conditionally on its message's
// fencing token, so a worker whose claim was taken over cannot apply a
// stale effect; Hooks count what the consumer did.
func ExampleMessageToken() {
	b, _ := membroker.New(membroker.Config{})
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store)
	defer guard.Close()
	_ = b.NewPublisher().Publish(context.Background(),
		&broker.Message{ID: "a", Topic: "orders"}, &broker.Message{ID: "b", Topic: "orders"})

	var mu sync.Mutex
	fenced := map[string]uint64{} // the effect's table: highest token applied per message
	acks := 0
	c, _ := consumer.New(consumer.Config{
		Subscriber: b.NewSubscriber("orders", "billing"),
		Guard:      guard,
		Workers:    1,
		Batch:      consumer.BatchConfig{Wait: 10 * time.Millisecond},
		BatchHandler: func(ctx context.Context, ms []*broker.Message) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range ms {
				tok, ok := consumer.MessageToken(ctx, m)
				if !ok || tok <= fenced[m.ID] {
					return errors.New("stale claim") // UPDATE ... WHERE token < $tok found no row
				}
				fenced[m.ID] = tok
			}
			return nil
		},
		Hooks: consumer.Hooks{OnAck: func(context.Context, consumer.AckEvent) { mu.Lock(); acks++; mu.Unlock() }},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	for c.Stats().Handled < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("effects:", len(fenced), "acks:", acks)
	// Output: effects: 2 acks: 2
}
