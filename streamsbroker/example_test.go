package streamsbroker_test

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
)

// A Redis Streams consumer group whose handler runs once per message id,
// with poison messages dead-lettered to another stream.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ctx := context.Background()
	stream := "example:orders:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer rdb.Del(ctx, stream, stream+":dead-letter", streamsbroker.DeadLetterStream(stream), "{"+stream+"}:idem-dedup:order-1/pay")

	pub, _ := streamsbroker.NewPublisher(streamsbroker.PublisherConfig{Client: rdb})
	// The id is fixed by the producer: publishing it again within the
	// dedup window adds nothing.
	for range 2 {
		if err := pub.Publish(ctx, &broker.Message{ID: "order-1/pay", Topic: stream, Payload: []byte(`{"amount":10}`)}); err != nil {
			log.Fatal(err)
		}
	}

	sub, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{
		Client: rdb, Stream: stream, Group: "billing", // AckWait 30s, MaxDeliver 20
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store, idem.WithRedeliveryWindow(sub.RedeliveryWindow()))
	defer guard.Close()
	runCtx, stop := context.WithCancel(ctx)
	c, _ := consumer.New(consumer.Config{
		Subscriber:      sub,
		Guard:           guard,
		DeadLetter:      pub,
		DeadLetterTopic: func(*broker.Message) string { return stream + ":dead-letter" },
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			fmt.Printf("%s %s delivery %d\n", m.ID, m.Payload, m.Delivery) // the effect
			stop()
			return nil, nil
		},
	})
	_ = c.Run(runCtx)
	// Output: order-1/pay {"amount":10} delivery 1
}
