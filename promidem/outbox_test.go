package promidem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/memoutbox"
	"github.com/idem-dev/idem/promidem"
)

// failingPublisher refuses topic "bad" always and message "flaky" once.
type failingPublisher struct {
	broker.Publisher
	flaky atomic.Bool
}

func (p *failingPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	for _, m := range msgs {
		if m.Topic == "bad" || (m.ID == "flaky" && p.flaky.CompareAndSwap(false, true)) {
			return errors.New("broker refused")
		}
	}
	return p.Publisher.Publish(ctx, msgs...)
}

// TestOutboxMetrics runs a relay over memoutbox with the collector's
// hooks: one message published at once, one after a retry, one failed
// after its two attempts; then a stats snapshot with one message pending
// and one failed, and the relay's own errors by operation.
func TestOutboxMetrics(t *testing.T) {
	ctx := context.Background()
	col, reg := newCollector(t, promidem.Config{})
	ob := memoutbox.New(memoutbox.Config{})
	mb, err := membroker.New(membroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hooks := col.OutboxHooks()
	r, err := outbox.New(outbox.Config{
		Backend: ob, Publisher: &failingPublisher{Publisher: mb.NewPublisher()}, BatchSize: 1,
		MaxAttempts: 2, Backoff: outbox.Backoff{Initial: time.Millisecond, Jitter: -1},
		Hooks: hooks, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(ctx, outbox.Message{ID: "good", Topic: "t"}, outbox.Message{ID: "flaky", Topic: "t"},
		outbox.Message{ID: "poison", Topic: "bad"}); err != nil {
		t.Fatal(err)
	}
	if n := scrape(t, reg)[`idem_outbox_oldest_pending_age_seconds`]; n != 0 {
		t.Fatalf("outbox gauges before any stats snapshot: %v, want absent", n)
	}
	for range 20 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if _, err := ob.Enqueue(ctx, outbox.Message{ID: "later", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	st, err := ob.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.At = st.OldestPending.Add(3 * time.Second) // the oldest pending row has waited 3s
	hooks.OnStats(ctx, st)
	hooks.OnError(ctx, "purge", errors.New("x"))
	hooks.OnError(ctx, "something new", errors.New("x"))

	want(t, scrape(t, reg), map[string]float64{
		`idem_outbox_published_total`:                  2,
		`idem_outbox_retries_total`:                    2, // flaky once, poison once
		`idem_outbox_failures_total`:                   1,
		`idem_outbox_publish_duration_seconds_count`:   2,
		`idem_outbox_publish_delay_seconds_count`:      2,
		`idem_outbox_messages{status="pending"}`:       1,
		`idem_outbox_messages{status="failed"}`:        1,
		`idem_outbox_oldest_pending_age_seconds`:       3,
		`idem_outbox_errors_total{operation="purge"}`:  1,
		`idem_outbox_errors_total{operation="other"}`:  1,
		`idem_outbox_errors_total{operation="claim"}`:  0,
		`idem_outbox_errors_total{operation="settle"}`: 0,
	})
}

func outboxStats() outbox.Stats {
	now := time.Now()
	return outbox.Stats{Pending: 3, Failed: 1, OldestPending: now.Add(-time.Minute), At: now}
}
