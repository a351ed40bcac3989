package streamsbroker_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
)

func newPub(t testing.TB, c redis.UniversalClient, mutate func(*streamsbroker.PublisherConfig)) *streamsbroker.Publisher {
	t.Helper()
	cfg := streamsbroker.PublisherConfig{Client: c}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := streamsbroker.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// newSub is a subscriber with a short ack wait (300ms) and claim interval
// (50ms) unless mutate says otherwise; closed at cleanup.
func newSub(t testing.TB, c redis.UniversalClient, stream, group string, mutate func(*streamsbroker.SubscriberConfig)) *streamsbroker.Subscriber {
	t.Helper()
	cfg := streamsbroker.SubscriberConfig{Client: c, Stream: stream, Group: group,
		AckWait: 300 * time.Millisecond, ClaimInterval: 50 * time.Millisecond, Logger: quietLogger()}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := streamsbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func publish(t testing.TB, p broker.Publisher, stream string, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs := make([]*broker.Message, len(ids))
	for i, id := range ids {
		msgs[i] = &broker.Message{ID: id, Topic: stream, Payload: []byte("payload of " + id)}
	}
	if err := p.Publish(ctx, msgs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// fetch fetches until want messages arrived or d passed; it returns what
// came (unsettled).
func fetch(t testing.TB, s broker.Subscriber, want int, d time.Duration) []*broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []*broker.Message
	for len(out) < want {
		msgs, err := s.Fetch(ctx, want-len(out))
		if err != nil {
			if ctx.Err() != nil {
				return out
			}
			t.Fatalf("fetch: %v", err)
		}
		out = append(out, msgs...)
	}
	return out
}

func bg(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pending is the group's pending count.
func pending(t testing.TB, c redis.UniversalClient, stream, group string) int64 {
	t.Helper()
	p, err := c.XPending(bg(t), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

func xlen(t testing.TB, c redis.UniversalClient, stream string) int64 {
	t.Helper()
	n, err := c.XLen(bg(t), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func entryID(t testing.TB, m *broker.Message) string {
	t.Helper()
	id, ok := streamsbroker.EntryID(m)
	if !ok {
		t.Fatalf("message %s has no entry id", m.ID)
	}
	return id
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
