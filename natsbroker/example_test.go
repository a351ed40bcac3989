package natsbroker_test

import (
	"context"
	"log"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A JetStream consumer whose handler runs once per message id, with poison
// messages dead-lettered to "orders.dead-letter".
func Example() {
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	// The stream holds both the topic and its dead-letter subject.
	_, _ = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders", "orders.dead-letter"}})

	pub, _ := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js})
	_ = pub.Publish(ctx, &broker.Message{ID: "order-1/pay", Topic: "orders", Payload: []byte(`{"amount":10}`)})

	sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{
		JS: js, Stream: "ORDERS", Durable: "billing", FilterSubject: "orders",
		AckWait: 30 * time.Second, MaxDeliver: 20,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store, idem.WithRedeliveryWindow(sub.RedeliveryWindow()))
	defer guard.Close()
	c, _ := consumer.New(consumer.Config{
		Subscriber:  sub,
		Guard:       guard,
		DeadLetter:  pub,
		MaxAttempts: 5, // below MaxDeliver, so poison reaches the dead-letter subject
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			// the effect, durable when this returns
			return nil, nil
		},
	})
	runCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = c.Run(runCtx)
}
