package otelidem_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsURL is the JetStream server of the machine; NATS_URL overrides it.
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// TestTraceThroughNATS: the same chain as TestTraceThroughMembroker on
// NATS JetStream (natsbroker), where the trace context travels in real
// message headers. Needs the server at NATS_URL; fails without it.
func TestTraceThroughNATS(t *testing.T) {
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("this test needs NATS JetStream at %s: %v", natsURL(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, wrap := range []bool{false, true} {
		name := "ContextWithBrokerTrace"
		if wrap {
			name = "Publisher"
		}
		t.Run(name, func(t *testing.T) {
			stream := fmt.Sprintf("otelidem_%d_%d", os.Getpid(), time.Now().UnixNano())
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}}); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = js.DeleteStream(context.Background(), stream) }()
			pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			topic, next := stream+".orders", stream+".payments"
			sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: js, Stream: stream, Durable: "billing", FilterSubject: topic})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			runChain(t, chain{pub: pub, sub: sub, topic: topic, next: next,
				downstream: func(t *testing.T) *broker.Message {
					down, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: js, Stream: stream, Durable: "audit", FilterSubject: next})
					if err != nil {
						t.Fatal(err)
					}
					defer down.Close()
					msgs, err := down.Fetch(ctx, 1)
					if err != nil || len(msgs) != 1 {
						t.Fatalf("downstream fetch: %d messages, %v", len(msgs), err)
					}
					_ = msgs[0].Acker.Ack(ctx)
					return msgs[0]
				}}, wrap)
		})
	}
}
