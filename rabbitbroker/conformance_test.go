package rabbitbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"github.com/idem-dev/idem/rabbitbroker"
)

// TestConformance runs the shared suite on the machine's RabbitMQ with the
// adapter's defaults (quorum queues, delivery limit 20, dead-letter
// exchange, delay buckets): one exchange per subtest, one queue per group,
// all deleted at cleanup.
func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		x := newTopo(t)
		// RabbitMQ keeps a message only in the queues bound when it is
		// published (the publisher gets ErrUnroutable otherwise), and the
		// suite publishes before it opens some subscribers: declare the
		// queues of the groups it uses first, as a deployment declares
		// its queues before its publishers start.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, g := range []string{"g", "group-a", "group-b"} {
			if err := rabbitbroker.Declare(ctx, x.subConfig(t, g)); err != nil {
				t.Fatal(err)
			}
		}
		return brokertest.Env{
			Topic: x.Topic,
			NewPublisher: func(t testing.TB) broker.Publisher {
				p, err := rabbitbroker.NewPublisher(x.pubConfig())
				if err != nil {
					t.Fatal(err)
				}
				return p
			},
			NewSubscriber: func(t testing.TB, group string) broker.Subscriber {
				s, err := rabbitbroker.NewSubscriber(x.subConfig(t, group))
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
		}
	}, brokertest.Features{
		OrderedByKey:        true, // one queue, FIFO
		ConsumerGroups:      true, // a queue per group
		NativeNakDelay:      true, // delay queues
		DeliveryCount:       true, // x-delivery-count
		RedeliverAfterClose: true,
		LostAfterClose:      true,
		MaxPayload:          1 << 20,
		AckWait:             0, // no ack wait: a delivery stays with its channel until it closes
		RedeliveryTimeout:   15 * time.Second,
	})
}
