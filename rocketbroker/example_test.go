package rocketbroker_test

import (
	"context"
	"log"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/rocketbroker"
)

// Example wires the adapter to the consumer runtime: a push consumer in
// group "orders-service" on topic "orders" (created on the broker
// beforehand, e.g. with mqadmin updateTopic), the guard in front of the
// handler, poison messages to "orders-poison". The subscriber starts in
// the background; WaitReady tells when it runs.
func Example() {
	client := rocketbroker.Client{NameServers: []string{"127.0.0.1:9876"}}
	sub, err := rocketbroker.NewSubscriber(rocketbroker.SubscriberConfig{
		Client: client, Group: "orders-service", Topics: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	pub, err := rocketbroker.NewPublisher(rocketbroker.PublisherConfig{Client: client})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	store, _ := memstore.New(memstore.Config{})
	guard, _ := idem.NewGuard(store, idem.WithRedeliveryWindow(sub.RedeliveryWindow()))
	c, err := consumer.New(consumer.Config{
		Subscriber: sub, // MaxDeliveries: the runtime never naks a last delivery
		Guard:      guard,
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			return nil, nil // the effect, once per message id
		},
		DeadLetter:      pub, // poison messages, once each, with their reason
		DeadLetterTopic: func(*broker.Message) string { return "orders-poison" },
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	err = pub.Publish(ctx, &broker.Message{ID: "order-1", Topic: "orders", Key: []byte("customer-7"), Payload: []byte(`{"id":1}`)})
	if err != nil {
		log.Fatal(err) // ErrUnavailable: no route (topic missing, name server down)
	}
	runCtx, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	_ = c.Run(runCtx)
}
