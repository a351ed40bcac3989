package kafkabroker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/kafkabroker"
	"github.com/idem-dev/idem/memstore"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Publish with acks=all and the idempotent producer, consume as a group
// member, ack after the effect.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	pub, err := kafkabroker.NewPublisher(kafkabroker.PublisherConfig{Brokers: cluster.ListenAddrs()})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	ctx := context.Background()
	// The id is fixed by the producer: a retry publishes the same id.
	msg := &broker.Message{ID: "order-42-created", Topic: "orders", Key: []byte("order-42"), Payload: []byte(`{"total":10}`)}
	if err := pub.Publish(ctx, msg); err != nil {
		log.Fatal(err)
	}

	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberConfig{
		Brokers: cluster.ListenAddrs(), Group: "billing", Topics: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs, err := sub.Fetch(fctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range msgs {
		fmt.Printf("%s %s delivery %d\n", m.ID, m.Payload, m.Delivery)
		// ... the effect, durably ...
		if err := m.Acker.Ack(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output: order-42-created {"total":10} delivery 1
}

// The consumer runtime over a Kafka subscriber: the guard's record TTL must
// cover the subscriber's redelivery window.
func Example_consumer() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "payments"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberConfig{
		Brokers: cluster.ListenAddrs(), Group: "ledger", Topics: []string{"payments"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	guard, err := idem.NewGuard(store, idem.WithTTL(24*time.Hour), idem.WithRedeliveryWindow(sub.RedeliveryWindow()))
	if err != nil {
		log.Fatal(err)
	}
	defer guard.Close()
	c, err := consumer.New(consumer.Config{
		Subscriber: sub,
		Guard:      guard,
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			return nil, nil // the effect
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = c.Run(ctx) // until ctx ends; drains and acks what finished
	fmt.Println("window:", sub.RedeliveryWindow())
	// Output: window: 6m56s
}
