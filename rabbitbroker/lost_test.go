package rabbitbroker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/rabbitbroker"
)

// TestLostDeliveriesLetGo: the consumer runtime holds n deliveries, each
// with its claim (a message's first run finds its database unavailable),
// when its connection is cut. The proxy refuses the subscriber's
// reconnects until the runtime has noticed the loss (InProgress reports
// ErrDeliveryLost) and let go of every delivery: none held or in flight,
// no claim in progress (released, not heartbeated until the minute-long
// lease lapses). Then the subscriber reconnects and gets the requeued
// messages: each takes effect exactly once, and none meets its key in
// progress (no "in progress elsewhere" nak: no copy waited for a lease).
// Before, the lost deliveries stayed held with their claims for as long
// as the consumer ran, and every copy was nak'ed as in progress.
//
// The runtime notices the loss through its InProgress signal (every 20ms
// here), or at once through the Ackers' broker.LostNotifier channel (the
// connection's): the second case signals only once an hour.
func TestLostDeliveriesLetGo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{{"InProgress", 20 * time.Millisecond}, {"LostNotifier", time.Hour}} {
		t.Run(tc.name, func(t *testing.T) { testLostLetGo(t, tc.interval) })
	}
}

func testLostLetGo(t *testing.T, inProgressInterval time.Duration) {
	const n = 50
	x := newTopo(t)
	net := proxy(t, "127.0.0.1:0", "127.0.0.1:5672")
	cfg := x.subConfig(t, "lost")
	if err := rabbitbroker.Declare(ctxT(t, 30*time.Second), cfg); err != nil {
		t.Fatal(err)
	}
	cfg.URL = net.URL() // the subscriber's only connection through the proxy
	sent := make([]*broker.Message, n)
	for i := range sent {
		sent[i] = &broker.Message{ID: fmt.Sprintf("lost-%03d", i), Topic: x.Topic, Payload: []byte("x")}
	}
	if err := x.publisher(t).Publish(ctxT(t, 30*time.Second), sent...); err != nil {
		t.Fatal(err)
	}

	store := e2etest.MemStore(t)
	guard := e2etest.NewGuard(t, store, idem.WithLease(time.Minute))
	var (
		mu       sync.Mutex
		healed   bool // the handler's database answers
		effects  = map[string]int{}
		busyNaks int // naks of a copy that found its key in progress
		acked    int
	)
	sub := subscriber(t, cfg)
	c, stop := e2etest.RunConsumer(t, consumer.Config{
		Subscriber: sub,
		Guard:      guard,
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			if !healed {
				return nil, fmt.Errorf("%w: the handler's database is down", idem.ErrUnavailable)
			}
			effects[m.ID]++
			return nil, nil
		},
		Workers:            4,
		InProgressInterval: inProgressInterval,
		Backoff:            consumer.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		StoreDownDelay:     100 * time.Millisecond,
		Logger:             quiet(),
		Hooks: consumer.Hooks{
			OnNak: func(_ context.Context, e consumer.NakEvent) {
				mu.Lock()
				defer mu.Unlock()
				if e.Reason == "in progress elsewhere" {
					busyNaks++
				}
			},
			OnAck: func(context.Context, consumer.AckEvent) {
				mu.Lock()
				defer mu.Unlock()
				acked++
			},
		},
	})
	e2etest.WaitFor(t, "every delivery held with its claim", time.Minute, func() (bool, string) {
		s := c.Stats()
		return s.HeldNow == n, fmt.Sprintf("stats %+v", s)
	})

	net.refusing.Store(true)
	if cut := net.cut(); cut != 1 {
		t.Fatalf("cut %d connections, want 1", cut)
	}
	e2etest.WaitFor(t, "the lost deliveries let go", time.Minute, func() (bool, string) {
		s := c.Stats()
		return s.Lost == n && s.HeldNow == 0 && s.InFlight == 0, fmt.Sprintf("stats %+v", s)
	})
	for _, m := range sent {
		rec, err := store.Get(context.Background(), []byte(m.ID))
		if err != nil {
			t.Fatal(err)
		}
		if rec.State == idem.StateInProgress {
			t.Fatalf("%s: the lost delivery's claim is still held (token %d): its copy would wait for the lease", m.ID, rec.Token)
		}
	}

	mu.Lock()
	healed = true // only the copies run from now on: the lost ones were let go
	mu.Unlock()
	net.refusing.Store(false)
	e2etest.WaitFor(t, "every copy handled", time.Minute, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(effects) == n && acked == n, fmt.Sprintf("%d of %d took effect, %d acked, stats %+v", len(effects), n, acked, c.Stats())
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if d := queueDepth(t, cfg.Queue); d != 0 {
		t.Fatalf("%d messages back in the queue after the consumer closed", d)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range sent {
		if effects[m.ID] != 1 {
			t.Errorf("%s took effect %d times, want once", m.ID, effects[m.ID])
		}
	}
	if s := c.Stats(); busyNaks != 0 || s.Lost != n || s.Handled != n || s.DeadLettered != 0 || s.SettleErrors != 0 {
		t.Fatalf("%d copies nak'ed as in progress, stats %+v; want none, %d lost and %d handled", busyNaks, s, n, n)
	}
}
