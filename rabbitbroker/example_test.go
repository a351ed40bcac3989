package rabbitbroker_test

import (
	"context"
	"log"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/rabbitbroker"
)

// Example wires the adapter to the consumer runtime: a quorum queue
// "orders" bound to routing key "order.created" on the default "idem"
// exchange, with its dead-letter exchange and queue, and the guard in
// front of the handler. The subscriber connects in the background; the
// queue is declared first so that nothing published before the consumer
// starts is unroutable.
func Example() {
	conn := rabbitbroker.Conn{URL: "amqp://guest:guest@127.0.0.1:5672/"}
	subCfg := rabbitbroker.SubscriberConfig{Conn: conn, Queue: "orders", Topics: []string{"order.created"}}
	ctx := context.Background()
	if err := rabbitbroker.Declare(ctx, subCfg); err != nil {
		log.Fatal(err)
	}
	sub, err := rabbitbroker.NewSubscriber(subCfg)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	pub, err := rabbitbroker.NewPublisher(rabbitbroker.PublisherConfig{Conn: conn})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	store, _ := memstore.New(memstore.Config{})
	guard, _ := idem.NewGuard(store, idem.WithRedeliveryWindow(sub.RedeliveryWindow()))
	c, err := consumer.New(consumer.Config{
		Subscriber: sub,
		Guard:      guard,
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			return nil, nil // the effect, once per message id
		},
		DeadLetter:      pub, // poison messages, once each, with their reason
		DeadLetterTopic: func(*broker.Message) string { return "order.poison" },
	})
	if err != nil {
		log.Fatal(err)
	}
	err = pub.Publish(ctx, &broker.Message{ID: "order-1", Topic: "order.created", Payload: []byte(`{"id":1}`)})
	if err != nil {
		log.Fatal(err) // ErrUnroutable if no queue is bound for the topic
	}
	runCtx, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	_ = c.Run(runCtx)
}
