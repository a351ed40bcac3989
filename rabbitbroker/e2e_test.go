package rabbitbroker_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/rabbitbroker"
)

// longRuns: IDEM_RABBIT_LONG=1 runs the end-to-end tests at the sizes the
// other adapters use (10,000 messages; 4,000 and a 25s store outage for
// the faults) and the broker-restart test on a RabbitMQ node of its own.
// The default keeps the module's run short (2,000 and 1,000 messages, a
// 10s outage). IDEM_E2E_MESSAGES overrides the message counts.
func longRuns() bool { return os.Getenv("IDEM_RABBIT_LONG") == "1" }

// messages is an end-to-end size: def by default, long with
// IDEM_RABBIT_LONG, IDEM_E2E_MESSAGES over both.
func messages(t testing.TB, def, long int) int {
	if os.Getenv("IDEM_E2E_MESSAGES") != "" {
		return e2etest.Messages(t, false)
	}
	if longRuns() {
		return long
	}
	return def
}

// publishWithDuplicates publishes messages 0..n-1 and dupFrac of them a
// second time a batch later: RabbitMQ has no broker-side dedup by id, so
// every duplicate reaches the consumer.
func publishWithDuplicates(t testing.TB, x topo, n int, dupFrac float64) {
	t.Helper()
	p := x.publisher(t)
	e2etest.Publish(t, p, p, x.Topic, 0, n, dupFrac)
}

// TestEndToEndExactlyOnce drives the consumer runtime over this adapter
// with its DEFAULT settings (quorum queue, delivery limit 20, prefetch
// 1024): N messages (2,000; 10,000 with IDEM_RABBIT_LONG) plus 20%
// duplicate publishes, consumed by two consumers sharing the queue.
// Consumer 1 turns 5% of its acks into naks (effect done, ack lost).
// Consumer 2 connects through a TCP proxy that is cut a quarter of the way
// in, while it holds prefetched deliveries: they are lost
// (ErrDeliveryLost, Stats.Lost), the broker requeues them, consumer 2
// reconnects. At
// three quarters consumer 1 leaves. The guard is on memstore or pgstore;
// each effect is a row appended to a PostgreSQL ledger without a unique
// constraint. Every message must be there exactly once and the queue must
// end empty with nothing unacked. (The broker closing a connection itself
// is TestServerClosesConnection; a consumer killed with SIGKILL,
// TestEndToEndFaults.)
func TestEndToEndExactlyOnce(t *testing.T) {
	// Its own exchanges, queues and ledger schemas: it runs beside the
	// other end-to-end test, after the sequential tests (the conformance
	// suite's per-case leak checks need the process to themselves).
	t.Parallel()
	for _, tc := range []struct {
		backend string
		mode    e2etest.Mode
	}{{"memstore", e2etest.Single}, {"memstore", e2etest.Batch}, {"pgstore", e2etest.Batch}} {
		t.Run(tc.backend+"/"+string(tc.mode), func(t *testing.T) { testEndToEnd(t, tc.backend, tc.mode) })
	}
}

func testEndToEnd(t *testing.T, backend string, mode e2etest.Mode) {
	n := messages(t, 2000, 10_000)
	x := newTopo(t)
	ledger := e2etest.NewLedger(t, "idem_rabbit")
	var store idem.Store = e2etest.MemStore(t)
	if backend == "pgstore" {
		store = e2etest.OpenPGStore(t, ledger)
	}
	// A short lease: "in progress elsewhere" naks wait at most its rest
	// (the 5s delay bucket), so the drain below is quick.
	guard := e2etest.NewGuard(t, store, idem.WithLease(3*time.Second))
	cfg := x.subConfig(t, "ledger")
	if err := rabbitbroker.Declare(ctxT(t, 30*time.Second), cfg); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	publishWithDuplicates(t, x, n, 0.2)
	t.Logf("published %d messages + ~20%% duplicates in %s", n, time.Since(start).Round(time.Millisecond))

	type member struct {
		c     *consumer.Consumer
		sub   *rabbitbroker.Subscriber
		chaos *e2etest.ChaosSub
		stop  func() error // e2etest.RunConsumer's
	}
	joined := 0
	join := func(nakEvery int64, url string) *member {
		c := cfg
		c.URL = url
		sub, err := rabbitbroker.NewSubscriber(c) // the adapter's defaults
		if err != nil {
			t.Fatal(err)
		}
		cs := &e2etest.ChaosSub{Subscriber: sub, NakEvery: nakEvery}
		m := &member{sub: sub, chaos: cs}
		m.c, m.stop = e2etest.RunConsumer(t, ledger.ConsumerConfig(cs, guard, mode))
		joined++
		name := fmt.Sprintf("consumer %d (ledger c%d)", joined, joined)
		t.Cleanup(func() { // evidence, with the ledger's (see e2etest.Ledger.Explain)
			if t.Failed() {
				t.Logf("%s at the failure: forced naks %d, connects %d, stats %+v", name, m.chaos.Forced(), m.sub.Connects(), m.c.Stats())
			}
		})
		return m
	}
	leave := func(m *member) {
		if err := m.stop(); err != nil {
			t.Fatalf("stopped consumer's Run = %v", err)
		}
		if err := m.sub.Close(); err != nil {
			t.Fatal(err)
		}
	}

	consumeStart := time.Now()
	net2 := proxy(t, "127.0.0.1:0", "127.0.0.1:5672")
	m1 := join(20, rabbitbroker.RabbitURL())
	m2 := join(0, net2.URL())
	ledger.WaitDistinct(t, "a quarter of the messages", n/4)
	// The cut must hit deliveries in flight (a CI run cut consumer 2 while
	// consumer 1's prefetch held the queue: nothing lost, no fault).
	e2etest.WaitFor(t, "consumer 2 to hold deliveries", time.Minute, func() (bool, string) {
		s := m2.c.Stats()
		return s.InFlight > 0, fmt.Sprintf("stats %+v", s)
	})
	if cut := net2.cut(); cut != 1 {
		t.Fatalf("cut %d connections of consumer 2, want 1", cut)
	}
	t.Logf("consumer 2's connection cut at %s", time.Since(start).Round(time.Millisecond))
	e2etest.WaitFor(t, "consumer 2 to reconnect", time.Minute, func() (bool, string) {
		return m2.sub.Connects() >= 2, fmt.Sprintf("%d connects", m2.sub.Connects())
	})
	ledger.WaitDistinct(t, "three quarters of the messages", 3*n/4)
	leave(m1)
	ledger.WaitDistinct(t, "every message", n)
	elapsed := time.Since(consumeStart)
	// Drain: nothing ready or unacked in the queue or its delay queues,
	// then (after consumer 2 stopped and closed, which requeues anything
	// unacked) still nothing.
	e2etest.WaitFor(t, "the queue to drain", 2*time.Minute, func() (bool, string) {
		r, u := queueCounts(t, cfg.Queue)
		d := delayedCount(t, cfg)
		return r+u+d == 0, fmt.Sprintf("%d ready, %d unacked, %d delayed", r, u, d)
	})
	leave(m2)
	if d := queueDepth(t, cfg.Queue); d != 0 {
		t.Fatalf("%d messages back in the queue after the consumers closed: left unacked", d)
	}
	ledger.AssertExactlyOnce(t, n)
	s1, s2 := m1.c.Stats(), m2.c.Stats()
	forced := m1.chaos.Forced() + m2.chaos.Forced()
	// Consumer 2's effects: completions recorded at once (Handled) or
	// handed to the guard's background (Unrecorded: under load all of a
	// consumer's may go that way; see rocketbroker's test).
	if forced == 0 || s1.Duplicates+s2.Duplicates == 0 || s2.Handled+s2.Unrecorded == 0 || m2.sub.Connects() < 2 || s2.Lost == 0 {
		t.Fatalf("no fault exercised: forced %d, consumer 2 connects %d, stats %+v %+v", forced, m2.sub.Connects(), s1, s2)
	}
	t.Logf("%s/%s: %d messages exactly once in %s (%.0f msgs/s); forced naks %d; consumer 2 reconnected (%d connects, %d deliveries lost); consumer 1 %+v; consumer 2 %+v",
		backend, mode, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), forced, m2.sub.Connects(), s2.Lost, s1, s2)
}
