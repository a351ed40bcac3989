package kafkabroker

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
)

// TestConformance runs the shared broker suite on an in-process Kafka. One
// cluster serves every subtest (each gets its own 4-partition topic), so the
// suite's per-subtest leak check sees only the clients the subtest made.
func TestConformance(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	// Topics are made up front: an admin request inside a subtest would
	// open a connection whose server-side goroutine outlives the
	// subtest's leak check.
	topics := make(chan string, 64)
	for range cap(topics) {
		topics <- createTopic(t, adm, 4)
	}
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		topic := <-topics
		env := &quiesce{base: serverConns()}
		return brokertest.Env{
			Topic: topic,
			NewPublisher: func(t testing.TB) broker.Publisher {
				p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), MaxMessageBytes: 2 << 20, Logger: quietLog()})
				if err != nil {
					t.Fatal(err)
				}
				env.open()
				return qPub{p, env}
			},
			NewSubscriber: func(t testing.TB, group string) broker.Subscriber {
				// Groups are per topic so subtests never share one.
				s, err := NewSubscriber(fastSub(c, topic+"-"+group, topic))
				if err != nil {
					t.Fatal(err)
				}
				env.open()
				return qSub{s, env}
			},
		}
	}, brokertest.Features{
		OrderedByKey:        true,
		ConsumerGroups:      true,
		NativeNakDelay:      true,  // held in memory for the delay, offset uncommitted
		DeliveryCount:       false, // Kafka does not count deliveries across members
		RedeliverAfterClose: true,
		MaxPayload:          1000 << 10, // Kafka's default message.max.bytes is 1048588
		RedeliveryTimeout:   15 * time.Second,
		NakDelay:            300 * time.Millisecond,
	})
}

// quiesce makes the last Close of an Env's clients wait until kfake's
// server-side goroutines for their connections are gone: they end a moment
// after the client hangs up, and on a loaded machine that moment can outlast
// the suite's leak check, which would then blame the adapter.
type quiesce struct {
	mu   sync.Mutex
	base int
	n    int
}

func (q *quiesce) open() {
	q.mu.Lock()
	q.n++
	q.mu.Unlock()
}

func (q *quiesce) closed() {
	q.mu.Lock()
	q.n--
	last := q.n == 0
	q.mu.Unlock()
	if !last {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && serverConns() > q.base; {
		time.Sleep(10 * time.Millisecond)
	}
}

type qPub struct {
	broker.Publisher
	q *quiesce
}

func (p qPub) Close() error {
	defer p.q.closed()
	return p.Publisher.Close()
}

type qSub struct {
	broker.Subscriber
	q *quiesce
}

func (s qSub) Close() error {
	defer s.q.closed()
	return s.Subscriber.Close()
}

// serverConns counts kfake's per-connection goroutines.
func serverConns() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("kfake.(*clientConn)")) {
			n++
		}
	}
	return n
}
