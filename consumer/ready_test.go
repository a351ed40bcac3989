package consumer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// readySub is a subscriber that is ready once ready is closed.
type readySub struct {
	broker.Subscriber
	ready chan struct{}
}

func (s *readySub) WaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	default:
	}
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestWaitReady: the consumer reports its subscriber's readiness
// (broker.Readier), and is ready at once over one without it.
func TestWaitReady(t *testing.T) {
	e := newEnv(t)
	done, cancel := context.WithCancel(context.Background())
	cancel()

	plain := e.config(e.sub("g"))
	plain.Handler = func(context.Context, *broker.Message) ([]byte, error) { return nil, nil }
	c, err := consumer.New(plain)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(done); err != nil {
		t.Fatalf("over a subscriber without readiness: %v", err)
	}

	rs := &readySub{Subscriber: e.sub("g2"), ready: make(chan struct{})}
	cfg := e.config(rs)
	cfg.Handler = plain.Handler
	c, err = consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("not ready: %v, want the context's error", err)
	}
	close(rs.ready)
	if err := c.WaitReady(done); err != nil {
		t.Fatalf("ready: %v", err)
	}
}
