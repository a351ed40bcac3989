package membroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
)

func fetch(t *testing.T, s broker.Subscriber, d time.Duration) []*broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	msgs, err := s.Fetch(ctx, 10)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	return msgs
}

func TestAckWaitRedeliveryAndMaxDeliver(t *testing.T) {
	b, err := membroker.New(membroker.Config{AckWait: 20 * time.Millisecond, MaxDeliver: 2})
	if err != nil {
		t.Fatal(err)
	}
	p := b.NewPublisher()
	if err := p.Publish(context.Background(), &broker.Message{ID: "a", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	s := b.NewSubscriber("t", "g")
	defer s.Close()
	if got := fetch(t, s, time.Second); len(got) != 1 || got[0].Delivery != 1 {
		t.Fatalf("first delivery: %v", got)
	}
	// Not settled: back after AckWait, with Delivery 2.
	if got := fetch(t, s, time.Second); len(got) != 1 || got[0].Delivery != 2 {
		t.Fatalf("redelivery: %v", got)
	}
	if ex := b.Exhausted("t", "g"); len(ex) != 0 {
		t.Fatalf("exhausted while its last delivery is in flight: %v", ex)
	}
	// MaxDeliver reached: never again.
	if got := fetch(t, s, 100*time.Millisecond); len(got) != 0 {
		t.Fatalf("delivered past MaxDeliver: %v", got)
	}
	if ex := b.Exhausted("t", "g"); len(ex) != 1 || ex[0] != "a" {
		t.Fatalf("Exhausted = %v, want [a]", ex)
	}
	if n := s.MaxDeliveries(); n != 2 {
		t.Fatalf("MaxDeliveries = %d", n)
	}
	if w := s.RedeliveryWindow(); w != 40*time.Millisecond {
		t.Fatalf("RedeliveryWindow = %s", w)
	}
}

func TestInProgressExtendsAckWait(t *testing.T) {
	b, _ := membroker.New(membroker.Config{AckWait: 300 * time.Millisecond})
	_ = b.NewPublisher().Publish(context.Background(), &broker.Message{ID: "a", Topic: "t"})
	s1 := b.NewSubscriber("t", "g")
	defer s1.Close()
	s2 := b.NewSubscriber("t", "g")
	defer s2.Close()
	got := fetch(t, s1, time.Second)
	if len(got) != 1 {
		t.Fatal("no delivery")
	}
	stop := time.After(600 * time.Millisecond)
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		case <-time.After(10 * time.Millisecond):
			_ = got[0].Acker.InProgress(context.Background())
		}
	}
	if again := fetch(t, s2, 10*time.Millisecond); len(again) != 0 {
		t.Fatal("redelivered while in progress")
	}
	_ = got[0].Acker.Ack(context.Background())
}

func TestPublishedAndValidation(t *testing.T) {
	if _, err := membroker.New(membroker.Config{AckWait: -1}); err == nil {
		t.Fatal("negative AckWait accepted")
	}
	b, _ := membroker.New(membroker.Config{})
	p := b.NewPublisher()
	for _, bad := range []*broker.Message{{Topic: "t"}, {ID: "x"}} {
		// Refused for good: the outbox relay counts its attempts even
		// when nothing else is published.
		if err := p.Publish(context.Background(), bad); !errors.Is(err, broker.ErrRejected) {
			t.Fatalf("message %+v: %v, want broker.ErrRejected", bad, err)
		}
	}
	m := &broker.Message{ID: "x", Topic: "t", Payload: []byte("p")}
	_ = p.Publish(context.Background(), m)
	m.Payload[0] = 'q' // the broker keeps its own copy
	if got := b.Published("t"); len(got) != 1 || string(got[0].Payload) != "p" {
		t.Fatalf("Published = %v", got)
	}
}

// TestLagCountsUnsettled: lag is what the group has not settled (never
// delivered, or delivered and not acked), per group, and a message its
// delivery limit stopped no longer counts.
func TestLagCountsUnsettled(t *testing.T) {
	ctx := context.Background()
	b, err := membroker.New(membroker.Config{AckWait: time.Hour, MaxDeliver: 1})
	if err != nil {
		t.Fatal(err)
	}
	var _ broker.LagReporter = (*membroker.Subscriber)(nil)
	p := b.NewPublisher()
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := p.Publish(ctx, &broker.Message{ID: id, Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	s := b.NewSubscriber("t", "g")
	defer s.Close()
	other := b.NewSubscriber("t", "other")
	defer other.Close()
	lag := func(s *membroker.Subscriber) int64 {
		t.Helper()
		n, err := s.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := lag(s); n != 4 {
		t.Fatalf("lag before any fetch = %d, want 4", n)
	}
	msgs, err := s.Fetch(ctx, 3)
	if err != nil || len(msgs) != 3 {
		t.Fatalf("fetch: %v %v", msgs, err)
	}
	if n := lag(s); n != 4 {
		t.Fatalf("lag with 3 in flight = %d, want 4 (delivered is not settled)", n)
	}
	_ = msgs[0].Acker.Ack(ctx)
	_ = msgs[1].Acker.Term(ctx, "poison")
	if n := lag(s); n != 2 {
		t.Fatalf("lag after ack and term = %d, want 2", n)
	}
	_ = msgs[2].Acker.Nak(ctx, 0) // its last delivery (MaxDeliver 1): never again
	if n := lag(s); n != 1 {
		t.Fatalf("lag after a nak on the last delivery = %d, want 1", n)
	}
	if n := lag(other); n != 4 {
		t.Fatalf("other group's lag = %d, want 4", n)
	}
}

// TestStaleDeliveryLost: a delivery that is no longer the live one (its
// subscriber closed, or it was delivered again after its ack wait)
// reports broker.ErrDeliveryLost from every Acker call and changes
// nothing; a delivery settled through its own Acker stays a no-op.
func TestStaleDeliveryLost(t *testing.T) {
	ctx := context.Background()
	b, _ := membroker.New(membroker.Config{AckWait: time.Hour})
	p := b.NewPublisher()
	for _, id := range []string{"a", "b"} {
		if err := p.Publish(ctx, &broker.Message{ID: id, Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	s1 := b.NewSubscriber("t", "g")
	first := fetch(t, s1, time.Second)
	if len(first) != 2 {
		t.Fatalf("fetched %d, want 2", len(first))
	}
	if err := first[0].Acker.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	_ = s1.Close() // first[1] goes back to the group
	if err := first[1].Acker.InProgress(ctx); !errors.Is(err, broker.ErrDeliveryLost) {
		t.Fatalf("InProgress after Close = %v, want ErrDeliveryLost", err)
	}
	for name, err := range map[string]error{
		"Ack": first[1].Acker.Ack(ctx), "Nak": first[1].Acker.Nak(ctx, 0), "Term": first[1].Acker.Term(ctx, "x"),
	} {
		if !errors.Is(err, broker.ErrDeliveryLost) {
			t.Fatalf("%s after Close = %v, want ErrDeliveryLost", name, err)
		}
	}
	if err := first[0].Acker.Ack(ctx); err != nil {
		t.Fatalf("second Ack of a settled delivery = %v, want nil", err)
	}
	if err := first[0].Acker.InProgress(ctx); err != nil {
		t.Fatalf("InProgress of a settled delivery = %v, want nil", err)
	}
	// The lost Ack changed nothing: b comes back.
	s2 := b.NewSubscriber("t", "g")
	defer s2.Close()
	again := fetch(t, s2, time.Second)
	if len(again) != 1 || again[0].ID != "b" || again[0].Delivery != 2 {
		t.Fatalf("after the lost settles: %+v, want b on its second delivery", again)
	}
	if err := again[0].Acker.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if lag, _ := s2.Lag(ctx); lag != 0 {
		t.Fatalf("Lag = %d, want 0", lag)
	}
}
