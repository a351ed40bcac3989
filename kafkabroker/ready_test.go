package kafkabroker

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"github.com/twmb/franz-go/pkg/kfake"
)

// TestSubscriberStartsBeforeBroker: the subscriber (and a Fetch) start
// while nothing listens on the broker's port; WaitReady reports it not
// ready (ctx's error, naming why). The broker starts later on that port:
// the subscriber joins, WaitReady returns nil, and the Fetch that was
// waiting all along returns the message published then.
func TestSubscriberStartsBeforeBroker(t *testing.T) {
	port := brokertest.FreePort(t)
	cfg := SubscriberConfig{
		Brokers:           []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(port))},
		Group:             uniq("g"),
		Topics:            []string{"late"},
		SessionTimeout:    time.Second,
		RebalanceTimeout:  3 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		CommitInterval:    100 * time.Millisecond,
		Logger:            quietLog(),
	}
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatalf("NewSubscriber with the broker down: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	type fetched struct {
		ms  []*broker.Message
		err error
	}
	fc := make(chan fetched, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		ms, err := s.Fetch(ctx, 10)
		fc <- fetched{ms, err}
	}()
	t.Logf("not ready: %v", brokertest.NotReady(t, s, 500*time.Millisecond))

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(1, "late"),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := s.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady after the broker started: %v", err)
	}
	publish(t, newPub(t, c), &broker.Message{ID: "m-1", Topic: "late", Payload: []byte("x")})
	select {
	case f := <-fc:
		if f.err != nil || len(f.ms) != 1 || f.ms[0].ID != "m-1" {
			t.Fatalf("Fetch = %d messages, %v", len(f.ms), f.err)
		}
		ackAll(t, f.ms)
	case <-ctx.Done():
		t.Fatal("the Fetch started before the broker never returned")
	}
	brokertest.ReadyThenClosed(t, s, s)
}
