package kafkabroker

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TestPublishRejected: a record the client or broker refuses for what it
// is (larger than MaxMessageBytes, larger than the topic's
// max.message.bytes, no ID, no topic) fails with an error wrapping
// broker.ErrRejected, alone and in a batch, so the outbox relay counts its
// attempts even while nothing else is published; the client's error (or
// idem.ErrInvalidArgument) stays in the chain.
func TestPublishRejected(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	small := uniq("small")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	maxBytes := "1024"
	if resp, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, small); err != nil || resp.Err != nil {
		t.Fatalf("create topic %s: %v, %v", small, err, resp.Err)
	}
	p := newPub(t, c)
	ok := &broker.Message{ID: "ok", Topic: topic, Payload: []byte("x")}
	for _, tc := range []struct {
		name string
		m    *broker.Message
		also error
	}{
		{"client max bytes", &broker.Message{ID: "big", Topic: topic, Payload: bytes.Repeat([]byte("x"), 3<<20)}, kerr.MessageTooLarge},
		{"topic max.message.bytes", &broker.Message{ID: "big2", Topic: small, Payload: incompressible(4096)}, kerr.MessageTooLarge},
		{"no id", &broker.Message{Topic: topic}, idem.ErrInvalidArgument},
		{"no topic", &broker.Message{ID: "nt"}, idem.ErrInvalidArgument},
	} {
		for _, batch := range [][]*broker.Message{{tc.m}, {ok, tc.m}} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := p.Publish(ctx, batch...)
			cancel()
			if !errors.Is(err, broker.ErrRejected) || !errors.Is(err, tc.also) || errors.Is(err, idem.ErrUnknownOutcome) {
				t.Errorf("%s (batch of %d): %v, want broker.ErrRejected and %v", tc.name, len(batch), err, tc.also)
			}
		}
	}
}

// incompressible returns n random bytes (the producer compresses batches).
func incompressible(n int) []byte {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return b
}
