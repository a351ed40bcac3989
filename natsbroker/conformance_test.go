package natsbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"github.com/idem-dev/idem/natsbroker"
)

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		stream := newStream(t, nil)
		return brokertest.Env{
			Topic: stream,
			NewPublisher: func(t testing.TB) broker.Publisher {
				p, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js})
				if err != nil {
					t.Fatal(err)
				}
				return p
			},
			NewSubscriber: func(t testing.TB, group string) broker.Subscriber {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				s, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{
					JS: js, Stream: stream, Durable: group,
					AckWait:  2 * time.Second,
					PollWait: time.Second,
				})
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
		}
	}, brokertest.Features{
		OrderedByKey:        true,
		ConsumerGroups:      true,
		NativeNakDelay:      true,
		DeliveryCount:       true,
		RedeliverAfterClose: true,
		MaxPayload:          int(nc.MaxPayload()) - 4096,
		RedeliveryTimeout:   10 * time.Second,
	})
}
