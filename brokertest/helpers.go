package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
)

func newPub(t *testing.T, env Env) broker.Publisher {
	t.Helper()
	p := env.NewPublisher(t)
	if p == nil {
		t.Fatal("NewPublisher returned nil")
	}
	return p
}

func newSub(t *testing.T, env Env, group string) broker.Subscriber {
	t.Helper()
	s := env.NewSubscriber(t, group)
	if s == nil {
		t.Fatal("NewSubscriber returned nil")
	}
	return s
}

func closeOK(t *testing.T, what string, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Errorf("%s.Close: %v", what, err)
	}
}

// makeMsgs builds n messages on topic with unique ids and distinct payloads.
func makeMsgs(topic, prefix string, n int, key func(i int) []byte) []*broker.Message {
	out := make([]*broker.Message, n)
	for i := range out {
		m := &broker.Message{
			ID:      newID(prefix),
			Topic:   topic,
			Payload: fmt.Appendf(nil, "payload-%d", i),
		}
		if key != nil {
			m.Key = key(i)
		}
		out[i] = m
	}
	return out
}

func publish(t *testing.T, p broker.Publisher, msgs ...*broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Publish(ctx, msgs...); err != nil {
		t.Fatalf("Publish(%d messages): %v", len(msgs), err)
	}
}

func ack(t *testing.T, m *broker.Message) {
	t.Helper()
	if m.Acker == nil {
		t.Fatalf("message %s delivered without an Acker", m.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.Acker.Ack(ctx); err != nil {
		t.Fatalf("Ack(%s): %v", m.ID, err)
	}
}

// collect fetches from s until want returns true for the messages seen so
// far or timeout passes. Each delivery is passed to settle (which may ack,
// nak or leave it) before the next fetch. It returns every delivery in
// order, duplicates included.
func collect(t *testing.T, s broker.Subscriber, timeout time.Duration, done func(got []*broker.Message) bool, settle func(m *broker.Message)) []*broker.Message {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var got []*broker.Message
	for !done(got) {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(left, 2*time.Second))
		msgs, err := s.Fetch(ctx, 64)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Fetch: %v", err)
		}
		for _, m := range msgs {
			if settle != nil {
				settle(m)
			}
			got = append(got, m)
		}
	}
	return got
}

// ackAll settles every delivery with Ack.
func ackAll(t *testing.T) func(*broker.Message) {
	return func(m *broker.Message) { ack(t, m) }
}

// untilIDs is a done func: true once every id in want has been seen.
func untilIDs(want []*broker.Message) func([]*broker.Message) bool {
	return func(got []*broker.Message) bool { return len(missing(want, got)) == 0 }
}

// missing lists the ids of want not in got.
func missing(want, got []*broker.Message) []string {
	seen := make(map[string]bool, len(got))
	for _, m := range got {
		seen[m.ID] = true
	}
	var out []string
	for _, m := range want {
		if !seen[m.ID] {
			out = append(out, m.ID)
		}
	}
	return out
}

func byID(msgs []*broker.Message) map[string]*broker.Message {
	out := make(map[string]*broker.Message, len(msgs))
	for _, m := range msgs {
		out[m.ID] = m
	}
	return out
}

// checkSame asserts that a delivery carries what was published.
func checkSame(t *testing.T, sent, got *broker.Message) {
	t.Helper()
	if got.Topic != sent.Topic {
		t.Errorf("message %s: Topic %q, want %q", sent.ID, got.Topic, sent.Topic)
	}
	if !bytes.Equal(got.Payload, sent.Payload) {
		t.Errorf("message %s: payload differs (%d bytes, want %d)", sent.ID, len(got.Payload), len(sent.Payload))
	}
	if got.Delivery < 1 {
		t.Errorf("message %s: Delivery %d, want >= 1", sent.ID, got.Delivery)
	}
}

// watch fetches from every subscriber in subs at once until done reports
// true or timeout passes. Each delivery is passed to settle; settle and
// done run under one lock, so they need none of their own. It returns
// false if it stopped on the timeout.
func watch(t *testing.T, subs []broker.Subscriber, timeout time.Duration, done func() bool, settle func(m *broker.Message)) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var mu sync.Mutex
	finished := false
	check := func() {
		if done != nil && done() {
			finished = true
			cancel()
		}
	}
	mu.Lock()
	check()
	mu.Unlock()
	var wg sync.WaitGroup
	for i, s := range subs {
		wg.Go(func() {
			for ctx.Err() == nil {
				msgs, err := s.Fetch(ctx, 64)
				if err != nil && ctx.Err() == nil {
					t.Errorf("subscriber %d Fetch: %v", i, err)
					return
				}
				mu.Lock()
				for _, m := range msgs {
					settle(m)
				}
				check()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return finished
}

// settleOK reports a failed settle call without stopping the goroutine
// (watch's settle runs on fetching goroutines).
func settleOK(t *testing.T, what string, m *broker.Message, err error) {
	if err != nil {
		t.Errorf("%s(%s): %v", what, m.ID, err)
	}
}

// bg is a context for settle calls made from watch callbacks.
func bg(t *testing.T) context.Context { return ctxFor(t, 30*time.Second) }
