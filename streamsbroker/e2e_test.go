package streamsbroker_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
)

// longRuns: IDEM_STREAMS_LONG=1 runs the end-to-end tests at the other
// adapters' sizes (10,000 messages; 4,000 for the faults). The default
// keeps the module's run short (2,000 and 2,000). IDEM_E2E_MESSAGES
// overrides both.
func longRuns() bool { return os.Getenv("IDEM_STREAMS_LONG") == "1" }

// messages is an end-to-end size: def by default, long with
// IDEM_STREAMS_LONG, IDEM_E2E_MESSAGES over both.
func messages(t testing.TB, def, long int) int {
	if os.Getenv("IDEM_E2E_MESSAGES") != "" {
		return e2etest.Messages(t, false)
	}
	if longRuns() {
		return long
	}
	return def
}

// publishWithDuplicates publishes messages 0..n-1 with the dedup window on
// and re-publishes dupFrac of them, a batch later, with dedup off, so the
// duplicates really reach the consumer (as after the window).
func publishWithDuplicates(t testing.TB, c redis.UniversalClient, stream string, n int, dupFrac float64) {
	t.Helper()
	pub := newPub(t, c, nil)
	dupPub := newPub(t, c, func(cfg *streamsbroker.PublisherConfig) { cfg.NoDedup = true })
	e2etest.Publish(t, pub, dupPub, stream, 0, n, dupFrac)
}

// TestEndToEndExactlyOnce drives the consumer runtime over this adapter
// with its DEFAULT settings (AckWait 30s, MaxDeliver 20, ClaimInterval 1s)
// on the shared Redis: N messages (2,000; 10,000 with IDEM_STREAMS_LONG)
// plus 20% duplicate publishes that bypass the dedup window, published in
// two halves. Consumer 1 turns 5% of its acks into naks (effect done, ack
// lost); consumer 2 joins the group a quarter of the way in, before the
// second half is published, and both consume at once; at three quarters
// consumer 1 stops and closes (what it still held is handed back to the
// group). The guard is on memstore or on pgstore (records durable in
// the same PostgreSQL); each effect is a row appended to a PostgreSQL
// ledger without a unique constraint. Every message must be there exactly
// once, and the group must end with nothing pending or unread. (A consumer
// killed with SIGKILL, a store outage and poison messages are
// TestEndToEndFaults.)
func TestEndToEndExactlyOnce(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	for _, tc := range []struct {
		backend string
		mode    e2etest.Mode
	}{
		{"memstore", e2etest.Single},
		{"memstore", e2etest.Batch},
		{"pgstore", e2etest.Batch},
	} {
		t.Run(tc.backend+"/"+string(tc.mode), func(t *testing.T) { testEndToEnd(t, c, tc.backend, tc.mode) })
	}
}

func testEndToEnd(t *testing.T, c redis.UniversalClient, backend string, mode e2etest.Mode) {
	n := messages(t, 2000, 10_000)
	stream := newStream(t, c)
	ledger := e2etest.NewLedger(t, "idem_streams_e2e")
	var store idem.Store
	if backend == "pgstore" {
		store = e2etest.OpenPGStore(t, ledger)
	} else {
		store = e2etest.MemStore(t)
	}
	// A duplicate of a key in progress is nak'ed for the holder's remaining
	// lease: 10s (as natsbroker's test) keeps the drain short.
	guard := e2etest.NewGuard(t, store, idem.WithLease(10*time.Second))

	type member struct {
		c     *consumer.Consumer
		chaos *e2etest.ChaosSub
		sub   *streamsbroker.Subscriber
		leave func() // stops the consumer and closes the subscriber
	}
	join := func(nakEvery int64) *member {
		sub, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: c, Stream: stream, Group: "ledger", Logger: e2etest.Quiet()})
		if err != nil {
			t.Fatal(err)
		}
		// Closed at cleanup too (Close is idempotent), after RunConsumer's
		// cleanup has stopped the consumer (cleanups run last first) and
		// before the stream is dropped, even when the test fails half
		// way: a consumer left running would find the group gone and
		// create the stream again.
		t.Cleanup(func() { _ = sub.Close() })
		m := &member{sub: sub, chaos: &e2etest.ChaosSub{Subscriber: sub, NakEvery: nakEvery}}
		var stop func() error
		m.c, stop = e2etest.RunConsumer(t, ledger.ConsumerConfig(m.chaos, guard, mode))
		m.leave = func() {
			if err := stop(); err != nil {
				t.Errorf("Run = %v", err)
			}
			if err := sub.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
		}
		return m
	}
	pub := newPub(t, c, nil)
	dupPub := newPub(t, c, func(cfg *streamsbroker.PublisherConfig) { cfg.NoDedup = true })
	consumeStart := time.Now()
	e2etest.Publish(t, pub, dupPub, stream, 0, n/2, 0.2)
	m1 := join(20) // 5% lost acks
	ledger.WaitDistinct(t, "a quarter of the messages", n/4)
	m2 := join(0)
	e2etest.Publish(t, pub, dupPub, stream, n/2, n, 0.2)
	ledger.WaitDistinct(t, "three quarters of the messages", 3*n/4)
	m1.leave()
	ledger.WaitDistinct(t, "every message", n)
	elapsed := time.Since(consumeStart)
	waitDrained(t, c, stream, "ledger", 2*time.Minute)
	m2.leave()

	ledger.AssertExactlyOnce(t, n)
	s1, s2 := m1.c.Stats(), m2.c.Stats()
	if m1.chaos.Forced() == 0 || s1.Duplicates+s2.Duplicates == 0 || s2.Handled == 0 {
		t.Fatalf("no fault exercised: forced %d, stats %+v %+v", m1.chaos.Forced(), s1, s2)
	}
	t.Logf("%s/%s: %d messages exactly once in %s; lost acks %d; consumer 1 %+v %+v; consumer 2 %+v %+v",
		backend, mode, n, elapsed.Round(time.Millisecond), m1.chaos.Forced(), s1, m1.sub.Stats(), s2, m2.sub.Stats())
}

// waitDrained waits until group has nothing pending and has read the
// stream to its end.
func waitDrained(t testing.TB, c redis.UniversalClient, stream, group string, d time.Duration) {
	t.Helper()
	e2etest.WaitFor(t, "the group to drain", d, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, err := c.XInfoStream(ctx, stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		groups, err := c.XInfoGroups(ctx, stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range groups {
			if g.Name == group {
				return g.Pending == 0 && g.LastDeliveredID == info.LastGeneratedID,
					fmt.Sprintf("%d pending, last delivered %s of %s", g.Pending, g.LastDeliveredID, info.LastGeneratedID)
			}
		}
		return false, "no group " + group
	})
}
