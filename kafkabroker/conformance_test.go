package kafkabroker

import (
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"go.uber.org/goleak"
)

// TestConformance runs the shared broker suite on an in-process Kafka. One
// cluster serves every subtest (each gets its own 4-partition topic), so the
// suite's per-subtest leak check sees only the clients the subtest made.
func TestConformance(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	// Topics are made up front: an admin request inside a subtest could
	// open a connection of the long-lived admin client, whose goroutines
	// would outlive the subtest's leak check.
	topics := make(chan string, 64)
	for range cap(topics) {
		topics <- createTopic(t, adm, 4)
	}
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		topic := <-topics
		return brokertest.Env{
			Topic: topic,
			NewPublisher: func(t testing.TB) broker.Publisher {
				p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), MaxMessageBytes: 2 << 20, Logger: quietLog()})
				if err != nil {
					t.Fatal(err)
				}
				return p
			},
			NewSubscriber: func(t testing.TB, group string) broker.Subscriber {
				// Groups are per topic so subtests never share one.
				s, err := NewSubscriber(fastSub(c, topic+"-"+group, topic))
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
		}
	}, brokertest.Features{
		OrderedByKey:        true,
		ConsumerGroups:      true,
		NativeNakDelay:      true,  // held in memory for the delay, offset uncommitted
		DeliveryCount:       false, // Kafka does not count deliveries across members
		RedeliverAfterClose: true,
		LostAfterClose:      true,
		MaxPayload:          1000 << 10, // Kafka's default message.max.bytes is 1048588
		RedeliveryTimeout:   15 * time.Second,
		AckWait:             0, // no ack wait: a delivery stays with its member until it leaves the group
		NakDelay:            300 * time.Millisecond,
		LeakOptions:         kfakeConnGoroutines(),
	})
}

// kfakeConnGoroutines ignores the in-process broker's side of each client
// connection: those goroutines end a moment after the client hangs up, and
// on a loaded machine that moment can outlast the suite's leak check, which
// would then blame the adapter. The client side (franz-go's goroutines,
// which the adapter must stop) is still checked.
func kfakeConnGoroutines() []goleak.Option {
	const cc = "github.com/twmb/franz-go/pkg/kfake.(*clientConn)."
	var opts []goleak.Option
	for _, f := range []string{"read", "read.func1", "write", "write.func1"} {
		opts = append(opts, goleak.IgnoreAnyFunction(cc+f))
	}
	return opts
}
