package outboxe2e

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/outbox"
	"github.com/nats-io/nats-server/v2/server"
)

// startNATS runs a nats-server in this process with JetStream stored in
// dir, on port (-1: a free one).
func startNATS(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("embedded nats-server not ready within 10s")
	}
	return s
}

func stopNATS(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// TestBrokerOutage: the broker (its own nats-server, JetStream on disk) goes
// down with messages still to publish and stays down for longer than the
// relay's whole backoff; then it comes back on the same port and store.
//   - Unlimited attempts: the relay keeps retrying and catches up by itself.
//   - The seed's 3 attempts: the same. An outage spends no message's
//     attempts (the broker took none of a round's messages and every
//     failure was its absence), so none fails and no operator is needed.
//     Before that rule this case asserted that all 100 failed, raised
//     OnFailed and were published only after an operator's Requeue.
//
// Nothing is lost: a guarded consumer applies every message exactly once.
func TestBrokerOutage(t *testing.T) {
	t.Parallel() // its own NATS servers, ledger schemas and stores
	for _, tc := range []struct {
		name        string
		maxAttempts int
	}{{"unlimited", outbox.Unlimited}, {"seed-3-attempts", 0}} {
		t.Run(tc.name, func(t *testing.T) { testBrokerOutage(t, tc.maxAttempts) })
	}
}

func testBrokerOutage(t *testing.T, maxAttempts int) {
	const n = 200
	start := time.Now()
	dir := t.TempDir()
	srv := startNATS(t, dir, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	url := srv.ClientURL()
	t.Cleanup(func() { stopNATS(srv) }) // after the stream's cleanup, which needs the server
	nc, js := connectJS(t, url)
	stream := newStream(t, js)
	topic := stream + ".orders"
	ledger := e2etest.NewLedger(t, "oe2e_outage")
	b := newBox(t, "postgres", ledger)

	pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js, Logger: e2etest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	var retries, failed atomic.Int64
	relay, err := outbox.New(outbox.Config{Backend: b.backend, Publisher: pub, BatchSize: 20, MaxAttempts: maxAttempts,
		PublishTimeout: 200 * time.Millisecond, Backoff: outbox.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger: e2etest.Quiet(), Hooks: outbox.Hooks{
			OnRetry:  func(context.Context, outbox.RetryEvent) { retries.Add(1) },
			OnFailed: func(context.Context, outbox.FailedEvent) { failed.Add(1) },
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	enqueueRange(t, b, topic, 0, n/2, 10)
	e2etest.WaitFor(t, "the first half published", time.Minute, func() (bool, string) {
		st, err := b.backend.Stats(context.Background())
		return err == nil && st.Pending == 0, ""
	})

	t.Logf("first half published at %s", time.Since(start))
	stopNATS(srv) // the outage
	enqueueRange(t, b, topic, n/2, n, 10)
	// Longer than the whole backoff: every waiting message has been
	// tried at least 3 times, and none failed, whatever MaxAttempts.
	e2etest.WaitFor(t, "attempts past the backoff", time.Minute, func() (bool, string) {
		return retries.Load() >= 3*n/2, ""
	})
	st, err := b.backend.Stats(ctxT(t))
	if err != nil || st.Pending != n/2 || st.Failed != 0 || failed.Load() != 0 {
		t.Fatalf("during the outage: %+v, %v, %d reported failed; want the second half pending, none failed", st, err, failed.Load())
	}

	t.Logf("outage longer than the backoff at %s", time.Since(start))
	srv = startNATS(t, dir, port) // back, same port and store
	t.Logf("broker back at %s", time.Since(start))
	waitDrained(t, b.backend)
	if failed.Load() != 0 {
		t.Fatalf("%d messages failed", failed.Load())
	}
	t.Logf("drained at %s", time.Since(start))
	if !nc.IsConnected() {
		t.Fatal("drained while disconnected")
	}

	guard := e2etest.NewGuard(t, newPGStore(t, ledger, nil), idem.WithLease(10*time.Second))
	stop := consume(t, ledger, js, stream, guard)
	ledger.WaitDistinct(t, "every message applied", n)
	waitConsumed(t, js, stream)
	stop()
	ledger.AssertExactlyOnce(t, n)
	t.Logf("retries during the outage: %d, failed: %d, stream: %d messages", retries.Load(), failed.Load(), streamCount(t, js, stream))
}
