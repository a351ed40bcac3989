package rabbitbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/rabbitbroker"
)

// heldThroughProxy: a subscriber (with heartbeat, 0 for the default)
// connected through a proxy of its own, holding n unacked deliveries. The 1s delay queue is
// already declared (by a Nak(1s) whose copy came back and was acked), so
// a Nak(1s) on this connection goes straight to its publish.
func heldThroughProxy(t *testing.T, n int, heartbeat time.Duration) (*tcpProxy, *rabbitbroker.Subscriber, []*broker.Message) {
	t.Helper()
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	px := proxy(t, "127.0.0.1:0", "127.0.0.1:5672")
	cfg.URL = px.URL()
	cfg.Heartbeat = heartbeat
	cfg.Reconnect = rabbitbroker.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}
	s := subscriber(t, cfg)
	p := x.publisher(t)
	publish(t, p, msgs(x.Topic, "warm", 1)...)
	warm := fetchN(t, s, 1, 10*time.Second)[0]
	if err := warm.Acker.Nak(ctxT(t, 10*time.Second), time.Second); err != nil {
		t.Fatal(err)
	}
	if back := fetchN(t, s, 1, 20*time.Second)[0]; back.ID != warm.ID {
		t.Fatalf("got %s, want the delayed copy of %s", back.ID, warm.ID)
	} else if err := back.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	sent := msgs(x.Topic, "held", n)
	for _, m := range sent {
		m.Payload = make([]byte, 4096) // a publish that the proxy counts
	}
	publish(t, p, sent...)
	return px, s, fetchN(t, s, n, 20*time.Second)
}

// nakAll calls Nak(1s) on every delivery at once, each with ctx; their
// errors come on the channel as they return.
func nakAll(ctx context.Context, held []*broker.Message) <-chan error {
	errs := make(chan error, len(held))
	for _, m := range held {
		go func() { errs <- m.Acker.Nak(ctx, time.Second) }()
	}
	return errs
}

// collect returns n errors from errs, failing the test if they have not
// all come when within ends (a hang).
func collect(t *testing.T, errs <-chan error, n int, within time.Duration) []error {
	t.Helper()
	wait := ctxT(t, within)
	var out []error
	for len(out) < n {
		select {
		case err := <-errs:
			out = append(out, err)
		case <-wait.Done():
			t.Fatalf("%d of %d Naks returned within %s; the rest hang", len(out), n, within)
		}
	}
	return out
}

// everyBack fetches until every message of held was delivered again and
// acks them: none was lost with its connection.
func everyBack(t *testing.T, s *rabbitbroker.Subscriber, held []*broker.Message) {
	t.Helper()
	want := map[string]bool{}
	for _, m := range held {
		want[m.ID] = true
	}
	ctx := ctxT(t, 60*time.Second)
	for len(want) > 0 {
		ms, err := s.Fetch(ctx, len(held))
		if err != nil {
			t.Fatalf("%d messages never came back: %v", len(want), err)
		}
		for _, m := range ms {
			delete(want, m.ID)
			if err := m.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
				t.Fatalf("Ack after reconnect: %v", err)
			}
		}
	}
}

// TestNakOnCutConnection: a subscriber holds n deliveries when its
// network first drops everything (the first Nak's delayed copy is sent
// and its confirm never comes, the others wait behind it) and then
// closes the connection. Every Nak(delay) returns ErrDeliveryLost well
// before its (long) context ends: none waits for a confirm that cannot
// come, none waits for another's. The broker redelivers all n.
func TestNakOnCutConnection(t *testing.T) {
	const n = 300
	px, s, held := heldThroughProxy(t, n, 0)
	if k := px.blackhole(); k != 1 {
		t.Fatalf("blackholed %d connections, want 1", k)
	}
	// Longer than the delayed copy's own 30s confirm timeout and than
	// the 20s the Naks get to return below: a Nak that waits for its
	// context, or for another's confirm timeout, fails the test.
	errc := nakAll(ctxT(t, 2*time.Minute), held)
	waitFor(t, "a delayed copy sent into the blackhole", func() bool { return px.dropped() >= 4096 })
	if k := px.cut(); k != 1 {
		t.Fatalf("cut %d connections, want 1", k)
	}
	errs := collect(t, errc, n, 20*time.Second)
	for i, err := range errs {
		if !errors.Is(err, rabbitbroker.ErrDeliveryLost) || !errors.Is(err, broker.ErrDeliveryLost) {
			t.Fatalf("Nak %d of a cut connection = %v, want ErrDeliveryLost", i, err)
		}
	}
	everyBack(t, s, held)
}

// TestNakOnBlackholedConnection: the network drops everything and closes
// nothing, and the first Nak(delay)'s copy waits for a confirm that does
// not come (its context is long). The other Naks, with short contexts,
// return by their own contexts (requeued with a nack, or ErrDeliveryLost
// or the context's error), not after the first one's confirm timeout;
// once the connection is cut the first one returns ErrDeliveryLost. The
// subscriber reconnects and the broker redelivers all n.
func TestNakOnBlackholedConnection(t *testing.T) {
	const n = 100
	// A 60s heartbeat: the client gives a silent broker 90s (3 x half
	// of it), so only the Naks' own contexts can end their waits here.
	px, s, held := heldThroughProxy(t, n, time.Minute)
	if k := px.blackhole(); k != 1 {
		t.Fatalf("blackholed %d connections, want 1", k)
	}
	first := nakAll(ctxT(t, 2*time.Minute), held[:1])
	waitFor(t, "a delayed copy sent into the blackhole", func() bool { return px.dropped() >= 4096 })
	// 15s: well before the first Nak's 30s confirm timeout.
	errs := collect(t, nakAll(ctxT(t, 3*time.Second), held[1:]), n-1, 15*time.Second)
	var nacked, lost, expired int
	for i, err := range errs {
		switch {
		case err == nil:
			nacked++
		case errors.Is(err, rabbitbroker.ErrDeliveryLost):
			lost++
		case errors.Is(err, context.DeadlineExceeded):
			expired++
		default:
			t.Fatalf("Nak %d behind a blackholed publish = %v, want nil, ErrDeliveryLost or DeadlineExceeded", i, err)
		}
	}
	t.Logf("Naks behind the blackholed one: %d requeued with a nack, %d lost, %d expired", nacked, lost, expired)
	if k := px.cut(); k != 1 {
		t.Fatalf("cut %d connections, want 1", k)
	}
	if err := collect(t, first, 1, 15*time.Second)[0]; !errors.Is(err, rabbitbroker.ErrDeliveryLost) {
		t.Fatalf("the blackholed Nak, once its connection is cut = %v, want ErrDeliveryLost", err)
	}
	waitFor(t, "a new connection", func() bool { return s.Connects() >= 2 && s.Connected() })
	everyBack(t, s, held)
}
