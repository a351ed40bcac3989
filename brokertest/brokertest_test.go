package brokertest_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/brokertest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var n atomic.Int64

// memAckWait is the in-memory broker's ack wait in these tests: long
// enough that InProgress every quarter of it is never late on a loaded
// machine, short enough for the suite's waits past it.
const memAckWait = time.Second

// memFeatures is what the in-memory broker promises: everything.
var memFeatures = brokertest.Features{
	OrderedByKey:        true,
	ConsumerGroups:      true,
	NativeNakDelay:      true,
	DeliveryCount:       true,
	RedeliverAfterClose: true,
	LostAfterClose:      true,
	MaxPayload:          1 << 20,
	NakDelay:            300 * time.Millisecond,
	AckWait:             memAckWait,
}

// TestMembroker runs the suite against the in-memory broker.
func TestMembroker(t *testing.T) {
	b, err := membroker.New(membroker.Config{AckWait: memAckWait})
	if err != nil {
		t.Fatal(err)
	}
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		topic := fmt.Sprintf("topic-%d", n.Add(1))
		return brokertest.Env{
			Topic:         topic,
			NewPublisher:  func(testing.TB) broker.Publisher { return b.NewPublisher() },
			NewSubscriber: func(_ testing.TB, group string) broker.Subscriber { return b.NewSubscriber(topic, group) },
		}
	}, memFeatures)
}
