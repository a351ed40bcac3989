package consumer_test

import (
	"context"
	"fmt"
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
