package promidem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus"
)

func waitFor(t *testing.T, what string, cond func() bool, show ...func() any) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			for _, f := range show {
				t.Log(f())
			}
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func series(t *testing.T, reg prometheus.Gatherer, s string) float64 {
	t.Helper()
	return scrape(t, reg)[normalize(s)]
}

// TestConsumerMetrics runs the consumer runtime on membroker with the
// collector's hooks and watches: a message handled, its duplicate, a
// flaky message nak'ed once, a poison message dead-lettered, a message
// in flight behind a gate (in-flight gauge, lag 1), a message held
// through a store outage (held gauge and hold counter while it lasts), and
// the subscription's lag falling to zero once all are settled.
func TestConsumerMetrics(t *testing.T) {
	ctx := context.Background()
	col, reg := newCollector(t, promidem.Config{PollInterval: -1})
	b, err := membroker.New(membroker.Config{AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	fs := faultstore.New(ms)
	g, err := idem.NewGuard(fs, idem.WithHooks(col.GuardHooks()), idem.WithLease(2*time.Second), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	sub := b.NewSubscriber("orders", "g")
	gate := make(chan struct{})
	var flaky atomic.Int32
	c, err := consumer.New(consumer.Config{
		Subscriber: sub, Guard: g, Hooks: col.ConsumerHooks(), DeadLetter: b.NewPublisher(),
		Workers: 4, Backoff: consumer.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
		InProcessMaxWait: time.Nanosecond, StoreDownDelay: 20 * time.Millisecond, Logger: quiet,
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			switch m.ID {
			case "poison":
				return nil, idem.Permanent(errors.New("poison"))
			case "flaky":
				if flaky.Add(1) == 1 {
					return nil, errors.New("flaky")
				}
			case "gated":
				<-gate
			}
			return nil, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	col.WatchConsumer(c)
	col.WatchLag(sub)
	pub := b.NewPublisher()
	publish := func(ids ...string) {
		for _, id := range ids {
			if err := pub.Publish(ctx, &broker.Message{ID: id, Topic: "orders", Payload: []byte(id)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("m1", "m1", "flaky", "poison")
	if n := series(t, reg, `idem_broker_lag_messages`); n != 4 {
		t.Fatalf("lag before the consumer runs = %v, want 4", n)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = c.Run(runCtx) }()
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	defer func() { openGate(); stop(); wg.Wait() }()

	waitFor(t, "four acks or dead letters", func() bool {
		s := scrape(t, reg)
		return s[`idem_consumer_acks_total{result="handled"}`] == 2 && s[`idem_consumer_acks_total{result="duplicate"}`] == 1 &&
			s[`idem_consumer_dead_letters_total{result="published"}`] == 1
	}, func() any { return scrape(t, reg) })
	publish("gated")
	waitFor(t, "one delivery in flight behind its gate", func() bool {
		return series(t, reg, `idem_consumer_in_flight_messages`) == 1 && series(t, reg, `idem_broker_lag_messages`) == 1
	})
	openGate()
	waitFor(t, "the gated message acked", func() bool {
		s := scrape(t, reg)
		return s[`idem_consumer_acks_total{result="handled"}`] == 3 && s[`idem_consumer_in_flight_messages`] == 0
	})
	fs.SetDown(true)
	publish("held")
	waitFor(t, "a held delivery", func() bool {
		s := scrape(t, reg)
		return s[`idem_consumer_held_messages`] == 1 && s[`idem_consumer_holds_total{reason="store_unavailable"}`] == 1
	})
	fs.SetDown(false)
	waitFor(t, "everything settled", func() bool {
		s := scrape(t, reg)
		return s[`idem_consumer_acks_total{result="handled"}`] == 4 && s[`idem_consumer_held_messages`] == 0 &&
			s[`idem_consumer_in_flight_messages`] == 0 && s[`idem_broker_lag_messages`] == 0
	})
	want(t, scrape(t, reg), map[string]float64{
		`idem_consumer_naks_total`:                              1, // flaky's first try
		`idem_consumer_dead_letters_total{result="terminated"}`: 0,
		`idem_consumer_unrecorded_acks_total`:                   0,
		`idem_consumer_broker_settle_errors_total`:              0,
		`idem_consumer_lost_deliveries_total`:                   0,
		`idem_claims_total{outcome="completed"}`:                1,
		`idem_poll_errors_total{source="broker"}`:               0,
	})
}
