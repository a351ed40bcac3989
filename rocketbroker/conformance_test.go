package rocketbroker_test

import (
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"github.com/idem-dev/idem/rocketbroker"
	"github.com/idem-dev/idem/rocketbroker/internal/fakerocket"
)

// TestConformance runs the shared suite with the adapter's defaults
// (concurrent push consumer, MaxReconsumeTimes 3, TermDeadLetter): a topic
// of 4 queues per subtest, a consumer group per suite group.
//
// Features it promises: consumer groups (queues are split among a
// group's members by rebalance; groups are independent), Nak(delay)
// honoured by the broker's delay levels, redelivery after a subscriber
// closes (its unsettled messages come back from the committed offset).
// Not: OrderedByKey (concurrent consumption; TestOrderlyConformance has
// it), DeliveryCount (a message redelivered after its consumer closed or
// died keeps its reconsume times: only naks count; TestNakCountsDelivery),
// an ack wait (a delivery in a callback is sent back only after
// ConsumeTimeout, 15 minutes: TestInProgressRestartsConsumeTimeout).
func TestConformance(t *testing.T) {
	testConformance(t, false)
}

func testConformance(t *testing.T, orderly bool) {
	c := shared
	if orderly && c.fake != nil {
		c = orderlyFake(t)
	}
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		x := c.newTopic(t, 4)
		return brokertest.Env{
			Topic: x.Name,
			NewPublisher: func(t testing.TB) broker.Publisher {
				p, err := rocketbroker.NewPublisher(x.pubConfig())
				if err != nil {
					t.Fatal(err)
				}
				return p
			},
			NewSubscriber: func(t testing.TB, group string) broker.Subscriber {
				cfg := x.subConfig(t, group)
				cfg.Orderly = orderly
				s, err := rocketbroker.NewSubscriber(cfg)
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
		}
	}, brokertest.Features{
		OrderedByKey:        orderly,
		ConsumerGroups:      true,
		NativeNakDelay:      true,
		RedeliverAfterClose: !orderly,
		LostAfterClose:      !orderly,
		MaxPayload:          1 << 20,
		RedeliveryTimeout:   redeliveryTimeout(c, orderly),
		LeakOptions:         leakOptions(),
	})
}

// redeliveryTimeout: in orderly mode a queue that moves to another member
// is locked by the member that had it until the broker's lock expires
// (the client does not unlock a queue it drops): 60s on a real broker.
func redeliveryTimeout(c *cluster, orderly bool) time.Duration {
	if orderly && c.fake == nil {
		return 90 * time.Second
	}
	return 30 * time.Second
}

// orderlyFake is a fake whose queue locks expire after 3s (60s on a real
// broker), for orderly consumers that take over each other's queues.
func orderlyFake(t *testing.T) *cluster {
	return startFake(t, fakerocket.Config{LockExpiry: 3 * time.Second})
}
