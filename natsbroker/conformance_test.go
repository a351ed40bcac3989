package natsbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"github.com/idem-dev/idem/natsbroker"
)

// TestConformance runs the shared suite on the machine's server (2.9.10 on
// the build machine) and on a current server embedded in the test, both
// with the adapter's defaults except a 2s ack wait.
func TestConformance(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			brokertest.Run(t, func(t testing.TB) brokertest.Env {
				stream := srv.newStream(t, nil)
				return brokertest.Env{
					Topic: stream,
					NewPublisher: func(t testing.TB) broker.Publisher {
						p, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: srv.js})
						if err != nil {
							t.Fatal(err)
						}
						return p
					},
					NewSubscriber: func(t testing.TB, group string) broker.Subscriber {
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						defer cancel()
						s, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{
							JS: srv.js, Stream: stream, Durable: group,
							AckWait:  conformanceAckWait,
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
				MaxPayload:          int(srv.nc.MaxPayload()) - 4096,
				AckWait:             conformanceAckWait,
				LeakOptions:         embeddedServerGoroutines(),
			})
		})
	}
}

const conformanceAckWait = 2 * time.Second
