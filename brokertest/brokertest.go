package brokertest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"go.uber.org/goleak"
)

// Env is one isolated topic on the broker under test. The factory creates
// it (a unique stream, topic or queue) and registers its removal with
// t.Cleanup.
type Env struct {
	// Topic is where the suite publishes (Message.Topic) and what every
	// subscriber of this Env reads.
	Topic string
	// NewPublisher returns a publisher with the adapter's reliable
	// defaults. The suite closes it.
	NewPublisher func(t testing.TB) broker.Publisher
	// NewSubscriber returns a subscriber on Topic in consumer group
	// (durable consumer) group. A group seen for the first time starts at
	// the beginning of the topic. Two subscribers of the same group share
	// its work and its unsettled messages; different groups each get every
	// message. The suite closes it; closing without settling is how the
	// suite simulates a consumer that dies.
	NewSubscriber func(t testing.TB, group string) broker.Subscriber
}

// Factory makes a fresh Env for one test.
type Factory func(t testing.TB) Env

// Features says what the broker promises; the suite tests exactly that.
type Features struct {
	// OrderedByKey: messages with the same Message.Key published by one
	// publisher are delivered to a single subscriber in publish order
	// (Kafka: per partition; JetStream: per stream).
	OrderedByKey bool
	// ConsumerGroups: two subscribers of one group split the work (each
	// gets some, none is lost) and separate groups each get everything.
	// Kafka needs at least two partitions for the split.
	ConsumerGroups bool
	// NativeNakDelay: Nak(delay) is honoured by the broker, so the message
	// does not come back before delay.
	NativeNakDelay bool
	// DeliveryCount: the broker counts deliveries, so a redelivered
	// message has Message.Delivery > 1.
	DeliveryCount bool
	// RedeliverAfterClose: the unsettled messages of a subscriber that is
	// closed are redelivered to another subscriber of the same group
	// (after AckWait, a rebalance...).
	RedeliverAfterClose bool
	// LostAfterClose: the unsettled deliveries of a subscriber that is
	// closed can no longer be settled, and say so: InProgress, Ack, Nak
	// and Term on them return an error wrapping broker.ErrDeliveryLost
	// (InProgress at least once Close has taken effect: an adapter whose
	// connection dies asynchronously may answer nil for a moment), change
	// nothing, and the messages come back to another subscriber of the
	// group. Needs RedeliverAfterClose.
	LostAfterClose bool
	// MaxPayload is the largest payload the suite sends (the broker's
	// limit minus headroom for headers). Default 256 KiB.
	MaxPayload int
	// AckWait is the factory's ack wait: the broker redelivers a delivery
	// that is neither settled nor kept alive with InProgress within it.
	// 0 means the broker never redelivers a delivery while its subscriber
	// lives (Kafka: only a member leaving the group does); the InProgress
	// case is then skipped.
	//
	// The suite derives every wait for something that must NOT happen
	// from it (an acked, terminated or in-progress message coming back):
	// it watches past the ack wait, and where it can it leaves a control
	// message unsettled that must come back meanwhile, so a wait that is
	// too short fails the case instead of passing it.
	AckWait time.Duration
	// RedeliveryTimeout is the longest the suite waits for a redelivery
	// that must happen (after Nak, after the ack wait, or after a
	// subscriber closed without settling). Set the factory's ack wait /
	// session timeout well below it. Default 5s + 3 x AckWait.
	RedeliveryTimeout time.Duration
	// DeliveryTimeout is the longest the suite waits for a published
	// message to be delivered. Default 30s.
	DeliveryTimeout time.Duration
	// NakDelay is the delay the NativeNakDelay test asks for. Default 1s.
	NakDelay time.Duration
	// LeakOptions are passed to each subtest's goleak check, e.g.
	// goleak.IgnoreTopFunction for a client's long-lived background
	// goroutine started lazily by the first test.
	LeakOptions []goleak.Option
}

func (f Features) withDefaults() Features {
	if f.MaxPayload <= 0 {
		f.MaxPayload = 256 << 10
	}
	if f.RedeliveryTimeout <= 0 {
		f.RedeliveryTimeout = 5*time.Second + 3*f.AckWait
	}
	if f.DeliveryTimeout <= 0 {
		f.DeliveryTimeout = 30 * time.Second
	}
	if f.NakDelay <= 0 {
		f.NakDelay = time.Second
	}
	return f
}

// Run runs the conformance suite as subtests of t. Every subtest gets its
// own Env from factory and checks for leaked goroutines when it ends
// (goroutines alive before it started, such as a shared connection's, are
// ignored).
func Run(t *testing.T, factory Factory, features Features) {
	f := features.withDefaults()
	tests := []struct {
		name string
		need bool
		fn   func(t *testing.T, env Env, f Features)
	}{
		{"PublishConsume", true, testPublishConsume},
		{"HeadersAndKeyRoundTrip", true, testHeadersRoundTrip},
		{"EmptyPayload", true, testEmptyPayload},
		{"LargePayload", true, testLargePayload},
		{"ConcurrentPublishers", true, testConcurrentPublishers},
		{"FetchBlocksUntilContextDone", true, testFetchBlocks},
		{"ClosedSubscriber", true, testClosedSubscriber},
		{"SettleTwice", true, testSettleTwice},
		{"RedeliveryWindow", true, testRedeliveryWindow},
		{"RedeliveryAfterNak", true, testRedeliveryAfterNak},
		{"NakDelayHonoured", f.NativeNakDelay, testNakDelay},
		{"TermNotRedelivered", true, testTerm},
		{"InProgress", true, testInProgress},
		{"RedeliveryAfterConsumerDeath", f.RedeliverAfterClose, testConsumerDeath},
		{"NoAckBeforeEffect", f.RedeliverAfterClose, testNoAckBeforeEffect},
		{"DeliveryLostAfterClose", f.LostAfterClose && f.RedeliverAfterClose, testDeliveryLost},
		{"OrderedByKey", f.OrderedByKey, testOrdering},
		{"ConsumerGroupSplitsWork", f.ConsumerGroups, testGroupSplit},
		{"SeparateGroupsEachGetAll", f.ConsumerGroups, testGroupFanOut},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.need {
				t.Skip("broker does not promise this (Features)")
			}
			// Deferred before the factory's cleanups run, so goroutines
			// are checked after the test closed its clients; the retry
			// inside VerifyNone lets background goroutines wind down.
			defer goleak.VerifyNone(t, append([]goleak.Option{goleak.IgnoreCurrent()}, f.LeakOptions...)...)
			env := factory(t)
			tc.fn(t, env, f)
		})
	}
}

// pastRedelivery is how long the suite watches for a message that must
// not come back: past the ack wait by half of it, plus half a second for
// the fetch round trips. Without an ack wait, a second for anything still
// in flight.
func (f Features) pastRedelivery() time.Duration {
	if f.AckWait <= 0 {
		return time.Second
	}
	return f.AckWait + f.AckWait/2 + 500*time.Millisecond
}

var seq atomic.Uint64

// newID returns a message id unique within the process run.
func newID(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), seq.Add(1))
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
