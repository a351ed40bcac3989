package brokertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
)

const collectTimeout = 30 * time.Second

func testPublishConsume(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	sent := makeMsgs(env.Topic, "pc", 50, nil)
	publish(t, p, sent...)
	got := collect(t, s, collectTimeout, untilIDs(sent), ackAll(t))
	if miss := missing(sent, got); len(miss) > 0 {
		t.Fatalf("%d of %d messages never delivered, e.g. %s", len(miss), len(sent), miss[0])
	}
	gotBy := byID(got)
	for _, m := range sent {
		checkSame(t, m, gotBy[m.ID])
	}
}

func testHeadersRoundTrip(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	m := &broker.Message{
		ID:    newID("hdr"),
		Topic: env.Topic,
		Key:   []byte("order-42"),
		Headers: map[string]string{
			broker.HeaderTraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			broker.HeaderTraceState:  "congo=t61rcWkgMzE",
			"x-tenant":               "acme",
			"x-unicode":              "héllo wörld",
			"x-spaces":               "a b  c",
		},
		Payload: []byte(`{"amount":10}`),
	}
	publish(t, p, m)
	got := collect(t, s, collectTimeout, untilIDs([]*broker.Message{m}), ackAll(t))
	g := byID(got)[m.ID]
	if g == nil {
		t.Fatalf("message %s never delivered", m.ID)
	}
	checkSame(t, m, g)
	if !bytes.Equal(g.Key, m.Key) {
		t.Errorf("Key = %q, want %q", g.Key, m.Key)
	}
	for k, v := range m.Headers {
		if g.Headers[k] != v {
			t.Errorf("header %q = %q, want %q", k, g.Headers[k], v)
		}
	}
}

func testEmptyPayload(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	m := &broker.Message{ID: newID("empty"), Topic: env.Topic}
	publish(t, p, m)
	got := collect(t, s, collectTimeout, untilIDs([]*broker.Message{m}), ackAll(t))
	g := byID(got)[m.ID]
	if g == nil {
		t.Fatalf("message %s never delivered", m.ID)
	}
	if len(g.Payload) != 0 {
		t.Errorf("payload is %d bytes, want 0", len(g.Payload))
	}
}

func testLargePayload(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	big := make([]byte, f.MaxPayload)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	m := &broker.Message{ID: newID("large"), Topic: env.Topic, Payload: big,
		Headers: map[string]string{"x-size": fmt.Sprint(len(big))}}
	publish(t, p, m)
	got := collect(t, s, collectTimeout, untilIDs([]*broker.Message{m}), ackAll(t))
	g := byID(got)[m.ID]
	if g == nil {
		t.Fatalf("message %s never delivered", m.ID)
	}
	checkSame(t, m, g)
}

func testConcurrentPublishers(t *testing.T, env Env, f Features) {
	const workers, each = 4, 25
	pubs := make([]broker.Publisher, 2)
	for i := range pubs {
		pubs[i] = newPub(t, env)
		defer closeOK(t, "publisher", pubs[i])
	}
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	var all []*broker.Message
	batches := make([][]*broker.Message, workers)
	for w := range batches {
		batches[w] = makeMsgs(env.Topic, fmt.Sprintf("cp%d", w), each, nil)
		all = append(all, batches[w]...)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, m := range batches[w] {
				if err := pubs[w%len(pubs)].Publish(ctx, m); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Publish: %v", err)
	}
	got := collect(t, s, collectTimeout, untilIDs(all), ackAll(t))
	if miss := missing(all, got); len(miss) > 0 {
		t.Fatalf("%d of %d messages never delivered", len(miss), len(all))
	}
}

func testFetchBlocks(t *testing.T, env Env, f Features) {
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	msgs, err := s.Fetch(ctx, 10)
	if len(msgs) != 0 {
		t.Fatalf("Fetch on an empty topic returned %d messages", len(msgs))
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch on an empty topic until the deadline: err = %v, want context.DeadlineExceeded", err)
	}
	// A context already done returns at once with its error.
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := s.Fetch(done, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch with a cancelled context: err = %v, want context.Canceled", err)
	}
}

func testClosedSubscriber(t *testing.T, env Env, f Features) {
	s := newSub(t, env, "g")
	closeOK(t, "subscriber", s)
	ctx := ctxFor(t, 5*time.Second)
	if _, err := s.Fetch(ctx, 1); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Fetch after Close: err = %v, want broker.ErrClosed", err)
	}
	p := newPub(t, env)
	closeOK(t, "publisher", p)
	if err := p.Publish(ctx, &broker.Message{ID: newID("closed"), Topic: env.Topic}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Publish after Close: err = %v, want broker.ErrClosed", err)
	}
}

func testSettleTwice(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	sent := makeMsgs(env.Topic, "twice", 1, nil)
	publish(t, p, sent...)
	got := collect(t, s, collectTimeout, untilIDs(sent), nil)
	m := byID(got)[sent[0].ID]
	if m == nil {
		t.Fatal("message never delivered")
	}
	ctx := ctxFor(t, 10*time.Second)
	if err := m.Acker.Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	// Settled: further calls are no-ops returning nil.
	if err := m.Acker.Ack(ctx); err != nil {
		t.Errorf("second Ack: %v, want nil", err)
	}
	if err := m.Acker.Nak(ctx, 0); err != nil {
		t.Errorf("Nak after Ack: %v, want nil", err)
	}
	if err := m.Acker.Term(ctx, "late"); err != nil {
		t.Errorf("Term after Ack: %v, want nil", err)
	}
}

func testRedeliveryWindow(t *testing.T, env Env, f Features) {
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)
	if w := s.RedeliveryWindow(); w <= 0 {
		t.Fatalf("RedeliveryWindow() = %s, want > 0", w)
	}
}

func testRedeliveryAfterNak(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	sent := makeMsgs(env.Topic, "nak", 3, nil)
	publish(t, p, sent...)
	target := sent[1].ID
	naked := 0
	var redelivered *broker.Message
	got := collect(t, s, f.RedeliveryTimeout+collectTimeout,
		func(got []*broker.Message) bool { return redelivered != nil && len(missing(sent, got)) == 0 },
		func(m *broker.Message) {
			if m.ID == target && naked == 0 {
				naked++
				if err := m.Acker.Nak(context.Background(), 0); err != nil {
					t.Fatalf("Nak: %v", err)
				}
				return
			}
			if m.ID == target {
				redelivered = m
			}
			ack(t, m)
		})
	if naked == 0 {
		t.Fatalf("message %s never delivered (%d deliveries)", target, len(got))
	}
	if redelivered == nil {
		t.Fatalf("message %s not redelivered after Nak(0)", target)
	}
	checkSame(t, sent[1], redelivered)
	if f.DeliveryCount && redelivered.Delivery < 2 {
		t.Errorf("redelivery has Delivery %d, want >= 2", redelivered.Delivery)
	}
}

func testNakDelay(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	sent := makeMsgs(env.Topic, "nakdelay", 1, nil)
	publish(t, p, sent...)
	var nakAt, backAt time.Time
	collect(t, s, f.RedeliveryTimeout+f.NakDelay+collectTimeout,
		func([]*broker.Message) bool { return !backAt.IsZero() },
		func(m *broker.Message) {
			if nakAt.IsZero() {
				nakAt = time.Now()
				if err := m.Acker.Nak(context.Background(), f.NakDelay); err != nil {
					t.Fatalf("Nak(%s): %v", f.NakDelay, err)
				}
				return
			}
			backAt = time.Now()
			ack(t, m)
		})
	if backAt.IsZero() {
		t.Fatalf("message not redelivered within %s of Nak(%s)", f.RedeliveryTimeout, f.NakDelay)
	}
	// A lower bound only: load can make it later, never earlier. Allow
	// for clock granularity.
	if d := backAt.Sub(nakAt); d < f.NakDelay-50*time.Millisecond {
		t.Fatalf("redelivered %s after Nak(%s)", d, f.NakDelay)
	}
}

func testTerm(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	poison := makeMsgs(env.Topic, "poison", 1, nil)
	publish(t, p, poison...)
	termed := 0
	collect(t, s, collectTimeout,
		func([]*broker.Message) bool { return termed > 0 },
		func(m *broker.Message) {
			if m.ID == poison[0].ID {
				termed++
				if err := m.Acker.Term(context.Background(), "poison"); err != nil {
					t.Fatalf("Term: %v", err)
				}
				return
			}
			ack(t, m)
		})
	if termed == 0 {
		t.Fatal("message never delivered")
	}
	// A marker published after Term: once it arrives, the terminated
	// message must not have come back.
	marker := makeMsgs(env.Topic, "marker", 1, nil)
	publish(t, p, marker...)
	got := collect(t, s, collectTimeout, untilIDs(marker), ackAll(t))
	for _, m := range got {
		if m.ID == poison[0].ID {
			t.Fatalf("terminated message %s was redelivered", m.ID)
		}
	}
	if miss := missing(marker, got); len(miss) > 0 {
		t.Fatal("marker never delivered")
	}
}

func testInProgress(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	sent := makeMsgs(env.Topic, "wip", 1, nil)
	publish(t, p, sent...)
	got := collect(t, s, collectTimeout, untilIDs(sent), func(m *broker.Message) {
		ctx := ctxFor(t, 10*time.Second)
		if err := m.Acker.InProgress(ctx); err != nil {
			t.Fatalf("InProgress: %v", err)
		}
		ack(t, m)
	})
	if len(got) == 0 {
		t.Fatal("message never delivered")
	}
}

// testConsumerDeath: a subscriber fetches and dies (Close without
// settling); another subscriber of the group gets every message.
func testConsumerDeath(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)

	sent := makeMsgs(env.Topic, "death", 10, nil)
	publish(t, p, sent...)
	s1 := newSub(t, env, "g")
	first := collect(t, s1, collectTimeout, untilIDs(sent), nil)
	closeOK(t, "dying subscriber", s1)
	if miss := missing(sent, first); len(miss) > 0 {
		t.Fatalf("first subscriber got %d of %d messages", len(sent)-len(miss), len(sent))
	}

	s2 := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s2)
	got := collect(t, s2, f.RedeliveryTimeout+collectTimeout, untilIDs(sent), ackAll(t))
	if miss := missing(sent, got); len(miss) > 0 {
		t.Fatalf("%d of %d unsettled messages of a dead subscriber never redelivered", len(miss), len(sent))
	}
	if f.DeliveryCount {
		for _, m := range got {
			if m.Delivery < 2 {
				t.Errorf("redelivered message %s has Delivery %d, want >= 2", m.ID, m.Delivery)
			}
		}
	}
}

// testNoAckBeforeEffect: only what the handler acked counts as consumed.
// The first half is acked, the second half is fetched but left unsettled
// (the effect never finished) and the subscriber closes: the second half
// comes back to the next subscriber, the first half does not.
func testNoAckBeforeEffect(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)

	sent := makeMsgs(env.Topic, "noack", 10, nil)
	publish(t, p, sent...)
	acked := make(map[string]bool)
	s1 := newSub(t, env, "g")
	first := collect(t, s1, collectTimeout, untilIDs(sent), nil)
	for _, m := range first {
		// Ack in publish order so brokers that commit offsets (contiguous
		// prefix) can commit the acked half.
		if slices.IndexFunc(sent[:5], func(s *broker.Message) bool { return s.ID == m.ID }) >= 0 && !acked[m.ID] {
			acked[m.ID] = true
			ack(t, m)
		}
	}
	closeOK(t, "subscriber", s1)
	if len(acked) != 5 {
		t.Fatalf("acked %d of the first 5 messages", len(acked))
	}

	s2 := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s2)
	rest := sent[5:]
	got := collect(t, s2, f.RedeliveryTimeout+collectTimeout, untilIDs(rest), ackAll(t))
	if miss := missing(rest, got); len(miss) > 0 {
		t.Fatalf("%d of %d unacked messages never redelivered", len(miss), len(rest))
	}
	for _, m := range got {
		if acked[m.ID] {
			t.Errorf("acked message %s was delivered again after Close", m.ID)
		}
	}
}

func testOrdering(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	keys := [][]byte{[]byte("k-a"), []byte("k-b"), []byte("k-c")}
	sent := makeMsgs(env.Topic, "ord", 90, func(i int) []byte { return keys[i%len(keys)] })
	// One Publish call per message, sequentially: order is what the
	// publisher saw confirmed.
	for _, m := range sent {
		publish(t, p, m)
	}
	got := collect(t, s, collectTimeout, untilIDs(sent), ackAll(t))
	if miss := missing(sent, got); len(miss) > 0 {
		t.Fatalf("%d of %d messages never delivered", len(miss), len(sent))
	}
	for _, k := range keys {
		var want, have []string
		for _, m := range sent {
			if bytes.Equal(m.Key, k) {
				want = append(want, m.ID)
			}
		}
		seen := map[string]bool{}
		for _, m := range got {
			if bytes.Equal(m.Key, k) && !seen[m.ID] {
				seen[m.ID] = true
				have = append(have, m.ID)
			}
		}
		if !slices.Equal(want, have) {
			t.Errorf("key %s: delivery order differs from publish order", k)
		}
	}
}

// testGroupSplit: two subscribers of one group fetch at once; both get a
// share and nothing is lost. Messages are published in rounds until both
// have received some, so brokers that assign work on join (Kafka
// rebalances) have time to.
func testGroupSplit(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	subs := []broker.Subscriber{newSub(t, env, "g"), newSub(t, env, "g")}

	var mu sync.Mutex
	got := make([]map[string]int, len(subs))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, s := range subs {
		got[i] = map[string]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				msgs, err := s.Fetch(ctx, 8)
				if err != nil && ctx.Err() == nil {
					t.Errorf("subscriber %d Fetch: %v", i, err)
					return
				}
				for _, m := range msgs {
					if err := m.Acker.Ack(context.Background()); err != nil {
						t.Errorf("subscriber %d Ack: %v", i, err)
					}
					mu.Lock()
					got[i][m.ID]++
					mu.Unlock()
				}
			}
		}()
	}

	var sent []*broker.Message
	deadline := time.Now().Add(f.RedeliveryTimeout + collectTimeout)
	keys := 16
	for round := 0; ; round++ {
		batch := makeMsgs(env.Topic, fmt.Sprintf("split%d", round), 40, func(i int) []byte { return fmt.Appendf(nil, "key-%d", i%keys) })
		publish(t, p, batch...)
		sent = append(sent, batch...)
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		both := len(got[0]) > 0 && len(got[1]) > 0
		mu.Unlock()
		if both || time.Now().After(deadline) {
			break
		}
	}
	// Wait for the rest to drain.
	for time.Now().Before(deadline) {
		mu.Lock()
		n := 0
		for _, m := range sent {
			if got[0][m.ID]+got[1][m.ID] > 0 {
				n++
			}
		}
		mu.Unlock()
		if n == len(sent) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	for i, s := range subs {
		closeOK(t, fmt.Sprintf("subscriber %d", i), s)
	}
	lost := 0
	for _, m := range sent {
		if got[0][m.ID]+got[1][m.ID] == 0 {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d messages delivered to neither subscriber of the group", lost, len(sent))
	}
	if len(got[0]) == 0 || len(got[1]) == 0 {
		t.Fatalf("group did not split the work: subscriber 0 got %d, subscriber 1 got %d", len(got[0]), len(got[1]))
	}
}

func testGroupFanOut(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	sa := newSub(t, env, "group-a")
	defer closeOK(t, "subscriber a", sa)
	sb := newSub(t, env, "group-b")
	defer closeOK(t, "subscriber b", sb)

	sent := makeMsgs(env.Topic, "fan", 20, nil)
	publish(t, p, sent...)
	for name, s := range map[string]broker.Subscriber{"group-a": sa, "group-b": sb} {
		got := collect(t, s, collectTimeout, untilIDs(sent), ackAll(t))
		if miss := missing(sent, got); len(miss) > 0 {
			t.Errorf("%s got %d of %d messages", name, len(sent)-len(miss), len(sent))
		}
	}
}
