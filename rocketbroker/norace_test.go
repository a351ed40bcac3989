//go:build !race

// The client reads a queue's message tree without its lock in orderly
// consumption (processQueue.takeMessages calls msgCache.Empty()) and in
// its expired-message cleaner (cleanExpiredMsg calls msgCache.Size(),
// every ConsumeTimeout), while the pull goroutine puts messages under the
// lock; the race detector reports that in whatever test is running. These
// tests exercise both, so they run without -race (go test
// ./rocketbroker/..., the README's long-run command); with the default
// ConsumeTimeout (15m) the cleaner never runs in the -race run.

package rocketbroker_test

import (
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/rocketbroker/internal/fakerocket"
)

// TestOrderlyConformance runs the suite with Orderly: each queue is
// consumed one message at a time, in order, under a broker lock; a nak
// suspends the queue and delivers the same message again. Without
// RedeliverAfterClose: its cases fetch ten messages without settling any,
// and an orderly queue hands out its next message only once the current
// one is settled (redelivery after a consumer's death is the same as
// concurrently: TestConformance). On the fake, queue locks expire after
// 3s instead of 60s, so a queue moved by a rebalance is taken over
// quickly (the client does not unlock a queue it drops).
func TestOrderlyConformance(t *testing.T) {
	testConformance(t, true)
}

// TestInProgressRestartsConsumeTimeout: the client sends back a message
// held in its consume callback for longer than ConsumeTimeout (a copy in
// the retry topic, one delivery counted). A delivery kept alive with
// InProgress is not sent back however long it is held; once the
// InProgress calls stop, it is. On a fake with short delay levels.
func TestInProgressRestartsConsumeTimeout(t *testing.T) {
	c := startFake(t, fakerocket.Config{DelayLevels: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond,
		300 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond}})
	x := c.newTopic(t, 1)
	cfg := x.subConfig(t, "g")
	cfg.ConsumeTimeout = time.Second
	s := subscriber(t, cfg)
	publish(t, x.publisher(t), msg(x.Name, "wip-1"))
	held := next(t, s, 30*time.Second)
	for range 16 { // 4 consume timeouts
		if err := held.Acker.InProgress(ctxT(t, time.Second)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if n := len(c.fake.Messages("%RETRY%" + cfg.Group)); n != 0 {
		t.Fatalf("a delivery kept alive was sent back %d times", n)
	}
	// Not kept alive any more: sent back and delivered again.
	back := next(t, s, 30*time.Second)
	if back.ID != held.ID || back.Delivery != 2 {
		t.Fatalf("after the consume timeout: %s delivery %d", back.ID, back.Delivery)
	}
	for _, m := range []*broker.Message{held, back} {
		if err := m.Acker.Ack(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOrderlyNakAndTerm: in orderly mode a nak suspends the queue and
// delivers the same message again (Delivery 2) before the next one of its
// queue; Term sends it to %DLQ%<group> (a suspension with its reconsume
// times past the maximum makes the client send it back with level -1)
// and the queue goes on.
func TestOrderlyNakAndTerm(t *testing.T) {
	x := quickTopic(t, 1)
	cfg := x.subConfig(t, "g")
	cfg.Orderly = true
	s := subscriber(t, cfg)
	if s.MaxDeliveries() != 5 {
		t.Fatalf("orderly MaxDeliveries %d, want 5", s.MaxDeliveries())
	}
	publish(t, x.publisher(t), msg(x.Name, "o-1"), msg(x.Name, "o-2"))
	a := next(t, s, 30*time.Second)
	if a.ID != "o-1" {
		t.Fatalf("first delivery %s", a.ID)
	}
	if err := a.Acker.Nak(ctxT(t, 10*time.Second), 0); err != nil {
		t.Fatal(err)
	}
	again := next(t, s, 30*time.Second)
	if again.ID != "o-1" || again.Delivery != 2 {
		t.Fatalf("after the nak: %s delivery %d", again.ID, again.Delivery)
	}
	if err := again.Acker.Term(ctxT(t, 10*time.Second), "poison"); err != nil {
		t.Fatal(err)
	}
	b := next(t, s, 30*time.Second)
	if b.ID != "o-2" {
		t.Fatalf("after the term: %s", b.ID)
	}
	if err := b.Acker.Ack(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if x.c.fake != nil {
		if dlq := x.c.fake.Messages("%DLQ%" + cfg.Group); len(dlq) != 1 || dlq[0].Properties["idem-message-id"] != "o-1" {
			t.Fatalf("%%DLQ%%: %+v", dlq)
		}
	}
}
