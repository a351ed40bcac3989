package streamsbroker_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// TestPublishRejected: a message the adapter refuses for what it is (no
// ID, a stream name that cannot be a key of its slot, too many headers)
// fails with an error wrapping broker.ErrRejected and still
// idem.ErrInvalidArgument, alone and in a batch, so the outbox relay
// counts its attempts even while nothing else is published.
func TestPublishRejected(t *testing.T) {
	c := sharedClient(t)
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	many := map[string]string{}
	for i := range 1001 {
		many[fmt.Sprint("h", i)] = "v"
	}
	ok := &broker.Message{ID: "ok", Topic: stream}
	for _, tc := range []struct {
		name string
		m    *broker.Message
	}{
		{"no id", &broker.Message{Topic: stream}},
		{"bad stream name", &broker.Message{ID: "x", Topic: "a}b"}},
		{"too many headers", &broker.Message{ID: "y", Topic: stream, Headers: many}},
	} {
		for _, batch := range [][]*broker.Message{{tc.m}, {ok, tc.m}} {
			err := p.Publish(bg(t), batch...)
			if !errors.Is(err, broker.ErrRejected) || !errors.Is(err, idem.ErrInvalidArgument) {
				t.Errorf("%s (batch of %d): %v, want broker.ErrRejected and idem.ErrInvalidArgument", tc.name, len(batch), err)
			}
		}
	}
}
