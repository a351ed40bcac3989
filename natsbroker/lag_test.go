package natsbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/natsbroker"
)

// TestLag: lag counts what the durable has not settled (not delivered, or
// delivered and not acked), on the machine's server and a current one.
func TestLag(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream := srv.newStream(t, nil)
			p, _ := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: srv.js})
			defer p.Close()
			for _, id := range []string{"a", "b", "c"} {
				if err := p.Publish(ctx, &broker.Message{ID: id, Topic: stream}); err != nil {
					t.Fatal(err)
				}
			}
			s, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: srv.js, Stream: stream, Durable: "g"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var lr broker.LagReporter = s
			lag := func() int64 {
				t.Helper()
				n, err := lr.Lag(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := lag(); n != 3 {
				t.Fatalf("lag before fetching = %d, want 3", n)
			}
			var msgs []*broker.Message
			for len(msgs) < 2 {
				got, err := s.Fetch(ctx, 2-len(msgs))
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, got...)
			}
			if n := lag(); n != 3 {
				t.Fatalf("lag with two delivered, unacked = %d, want 3", n)
			}
			if err := msgs[0].Acker.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			if err := msgs[1].Acker.Term(ctx, "poison"); err != nil {
				t.Fatal(err)
			}
			// Acks are sent without waiting for the server: poll.
			deadline := time.Now().Add(10 * time.Second)
			for n := lag(); n != 1; n = lag() {
				if time.Now().After(deadline) {
					t.Fatalf("lag after an ack and a term = %d, want 1", n)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
