package natsbroker_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestPublishErrorClasses: a message the server or client refuses itself
// (larger than the stream's MaxMsgSize or the server's max payload, no ID,
// no topic) fails with an error wrapping broker.ErrRejected, alone and in
// a batch, so the outbox relay counts its attempts even while nothing
// else is published; a publish on a closed connection wraps
// idem.ErrUnavailable (the broker's absence, which spends no message's
// attempts). The client's own errors stay in the chain.
func TestPublishErrorClasses(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			stream := srv.newStream(t, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 })
			p, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: srv.js})
			if err != nil {
				t.Fatal(err)
			}
			ok := &broker.Message{ID: "ok-" + stream, Topic: stream, Payload: []byte("x")}
			for _, tc := range []struct {
				name string
				m    *broker.Message
				also error
			}{
				{"stream max msg size", &broker.Message{ID: "big-" + stream, Topic: stream, Payload: bytes.Repeat([]byte("x"), 2048)}, nil},
				{"server max payload", &broker.Message{ID: "huge-" + stream, Topic: stream, Payload: make([]byte, srv.nc.MaxPayload()+1)}, nats.ErrMaxPayload},
				{"no id", &broker.Message{Topic: stream}, nil},
				{"no topic", &broker.Message{ID: "nt-" + stream}, nil},
			} {
				for _, batch := range [][]*broker.Message{{tc.m}, {ok, tc.m}} {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := p.Publish(ctx, batch...)
					cancel()
					if !errors.Is(err, broker.ErrRejected) || errors.Is(err, idem.ErrUnavailable) {
						t.Errorf("%s (batch of %d): %v, want broker.ErrRejected", tc.name, len(batch), err)
					}
					if tc.also != nil && !errors.Is(err, tc.also) {
						t.Errorf("%s: %v, want %v in the chain too", tc.name, err, tc.also)
					}
				}
			}
		})
	}
}

func TestPublishClosedConnUnavailable(t *testing.T) {
	stream := newStream(t, nil)
	c, err := nats.Connect(natsURL())
	if err != nil {
		t.Fatal(err)
	}
	j, err := jetstream.New(c)
	if err != nil {
		t.Fatal(err)
	}
	p, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: j})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	for _, n := range []int{1, 2} {
		var msgs []*broker.Message
		for i := range n {
			msgs = append(msgs, &broker.Message{ID: stream + string(rune('a'+i)), Topic: stream})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := p.Publish(ctx, msgs...)
		cancel()
		if !errors.Is(err, idem.ErrUnavailable) || !errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, broker.ErrRejected) {
			t.Errorf("batch of %d on a closed connection: %v, want idem.ErrUnavailable and nats.ErrConnectionClosed", n, err)
		}
	}
}
