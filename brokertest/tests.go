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

func testPublishConsume(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s)

	sent := makeMsgs(env.Topic, "pc", 50, nil)
	publish(t, p, sent...)
	got := collect(t, s, f.DeliveryTimeout, untilIDs(sent), ackAll(t))
	if miss := missing(sent, got); len(miss) > 0 {
		t.Fatalf("%d of %d messages never delivered, e.g. %s", len(miss), len(sent), miss[0])
	}
	gotBy := byID(got)
	for _, m := range sent {
		checkSame(t, m, gotBy[m.ID])
	}
	noneBack(t, s, f, sent, "acked")
}

// noneBack watches s past the redelivery time: none of msgs (which were
// settled: acked or terminated) may be delivered again.
func noneBack(t *testing.T, s broker.Subscriber, f Features, msgs []*broker.Message, how string) {
	t.Helper()
	settled := byID(msgs)
	var again []string
	watch(t, []broker.Subscriber{s}, f.pastRedelivery(), nil, func(m *broker.Message) {
		if settled[m.ID] != nil {
			again = append(again, fmt.Sprintf("%s (delivery %d)", m.ID, m.Delivery))
		}
		settleOK(t, "Ack", m, m.Acker.Ack(bg(t)))
	})
	if len(again) > 0 {
		t.Fatalf("%d %s message(s) delivered again within %s, e.g. %s", len(again), how, f.pastRedelivery(), again[0])
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
	got := collect(t, s, f.DeliveryTimeout, untilIDs([]*broker.Message{m}), ackAll(t))
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
	got := collect(t, s, f.DeliveryTimeout, untilIDs([]*broker.Message{m}), ackAll(t))
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
	got := collect(t, s, f.DeliveryTimeout, untilIDs([]*broker.Message{m}), ackAll(t))
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
	got := collect(t, s, f.DeliveryTimeout, untilIDs(all), ackAll(t))
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
	got := collect(t, s, f.DeliveryTimeout, untilIDs(sent), nil)
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
	got := collect(t, s, f.RedeliveryTimeout+f.DeliveryTimeout,
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

	sent := makeMsgs(env.Topic, "nakdelay", 1, func(int) []byte { return []byte("nak-key") })
	sent[0].Headers = map[string]string{"x-tenant": "acme"}
	publish(t, p, sent...)
	var nakAt, backAt time.Time
	var back *broker.Message
	collect(t, s, f.RedeliveryTimeout+f.NakDelay+f.DeliveryTimeout,
		func([]*broker.Message) bool { return !backAt.IsZero() },
		func(m *broker.Message) {
			if nakAt.IsZero() {
				nakAt = time.Now()
				if err := m.Acker.Nak(context.Background(), f.NakDelay); err != nil {
					t.Fatalf("Nak(%s): %v", f.NakDelay, err)
				}
				return
			}
			backAt, back = time.Now(), m
			ack(t, m)
		})
	if backAt.IsZero() {
		t.Fatalf("message not redelivered within %s of Nak(%s)", f.RedeliveryTimeout, f.NakDelay)
	}
	// The same message comes back (an adapter that delays by
	// re-publishing a copy must carry everything over).
	if back.ID != sent[0].ID {
		t.Fatalf("redelivered %s, want %s", back.ID, sent[0].ID)
	}
	checkSame(t, sent[0], back)
	if !bytes.Equal(back.Key, sent[0].Key) || back.Headers["x-tenant"] != "acme" {
		t.Errorf("delayed redelivery lost its key (%q) or header (%q)", back.Key, back.Headers["x-tenant"])
	}
	if f.DeliveryCount && back.Delivery < 2 {
		t.Errorf("delayed redelivery has Delivery %d, want >= 2", back.Delivery)
	}
	// A lower bound only: load can make it later, never earlier. Allow
	// for clock granularity.
	if d := backAt.Sub(nakAt); d < f.NakDelay-50*time.Millisecond {
		t.Fatalf("redelivered %s after Nak(%s)", d, f.NakDelay)
	}
}

// testTerm: a terminated message never comes back, neither to the
// subscriber that terminated it once the ack wait has passed, nor to the
// next member of the group. A control message with the same key, published
// after it and left unsettled, must come back meanwhile: that proves the
// case waited past the redelivery time (and, on brokers that commit a
// prefix, that the new member read past the terminated message).
func testTerm(t *testing.T, env Env, f Features) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s := newSub(t, env, "g")

	key := []byte(newID("term-key"))
	poison := makeMsgs(env.Topic, "poison", 1, func(int) []byte { return key })[0]
	control := makeMsgs(env.Topic, "control", 1, func(int) []byte { return key })[0]
	publish(t, p, poison)
	publish(t, p, control)

	var (
		termed, poisonAgain []*broker.Message
		controls            int
	)
	// settle terminates the poison's first delivery, records any later
	// one (acking it so it stops), and counts the control's deliveries,
	// leaving them unsettled unless ackControl.
	ackControl := false
	settle := func(m *broker.Message) {
		switch m.ID {
		case poison.ID:
			if len(termed) == 0 {
				termed = append(termed, m)
				settleOK(t, "Term", m, m.Acker.Term(bg(t), "poison"))
				return
			}
			poisonAgain = append(poisonAgain, m)
			settleOK(t, "Ack", m, m.Acker.Ack(bg(t)))
		case control.ID:
			controls++
			if ackControl {
				settleOK(t, "Ack", m, m.Acker.Ack(bg(t)))
			}
		default:
			settleOK(t, "Ack", m, m.Acker.Ack(bg(t)))
		}
	}
	subs := []broker.Subscriber{s}
	if !watch(t, subs, f.DeliveryTimeout, func() bool { return len(termed) > 0 && controls > 0 }, settle) {
		closeOK(t, "subscriber", s)
		t.Fatalf("poison and control not both delivered (poison %d, control %d)", len(termed), controls)
	}
	if f.AckWait > 0 {
		// The control comes back after the ack wait; then watch as long
		// again: the poison, delivered at the same time, would be back by
		// then if the Term had been ignored.
		if !watch(t, subs, f.RedeliveryTimeout, func() bool { return controls > 1 }, settle) {
			closeOK(t, "subscriber", s)
			t.Fatalf("the unsettled control message did not come back within %s: the case cannot tell a Term from a slow redelivery (is Features.AckWait right?)", f.RedeliveryTimeout)
		}
		watch(t, subs, f.pastRedelivery(), nil, settle)
		if len(poisonAgain) > 0 {
			closeOK(t, "subscriber", s)
			t.Fatalf("terminated message %s delivered again (delivery %d) after the ack wait", poison.ID, poisonAgain[0].Delivery)
		}
	}
	closeOK(t, "subscriber", s)
	if !f.RedeliverAfterClose {
		return
	}
	// The next member of the group gets the control (never settled) and
	// never the poison.
	s2 := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s2)
	seen := controls
	ackControl = true
	subs = []broker.Subscriber{s2}
	if !watch(t, subs, f.RedeliveryTimeout+f.DeliveryTimeout, func() bool { return controls > seen }, settle) {
		t.Fatalf("the unsettled control message never reached the group's next member")
	}
	watch(t, subs, f.pastRedelivery(), nil, settle)
	if len(poisonAgain) > 0 {
		t.Fatalf("terminated message %s delivered again to the group's next member (delivery %d)", poison.ID, poisonAgain[0].Delivery)
	}
}

// testInProgress: a delivery kept alive with InProgress past the ack wait
// is not redelivered, to its subscriber or to another member of the group,
// while a control message held as long without InProgress is: proof the
// case waited long enough.
func testInProgress(t *testing.T, env Env, f Features) {
	if f.AckWait <= 0 {
		t.Skip("Features.AckWait is 0: the broker never redelivers a delivery while its subscriber lives, so InProgress has nothing to hold back")
	}
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	s1 := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s1)

	kept := makeMsgs(env.Topic, "wip", 1, nil)[0]
	control := makeMsgs(env.Topic, "wip-control", 1, nil)[0]
	publish(t, p, kept, control)
	var held *broker.Message
	controls, keptAgain := 0, 0
	settle := func(m *broker.Message) {
		switch m.ID {
		case kept.ID:
			if held == nil {
				held = m
				return
			}
			keptAgain++
			settleOK(t, "Ack", m, m.Acker.Ack(bg(t)))
		case control.ID:
			controls++ // never settled: it must come back after the ack wait
		default:
			settleOK(t, "Ack", m, m.Acker.Ack(bg(t)))
		}
	}
	if !watch(t, []broker.Subscriber{s1}, f.DeliveryTimeout, func() bool { return held != nil && controls > 0 }, settle) {
		t.Fatal("messages never delivered")
	}
	// Keep it alive at a quarter of the ack wait for 2.5 ack waits.
	stop := make(chan struct{})
	beats := make(chan error, 1)
	go func() {
		tk := time.NewTicker(f.AckWait / 4)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				close(beats)
				return
			case <-tk.C:
				if err := held.Acker.InProgress(bg(t)); err != nil {
					select {
					case beats <- err:
					default:
					}
				}
			}
		}
	}()
	subs := []broker.Subscriber{s1}
	if f.ConsumerGroups {
		s2 := newSub(t, env, "g")
		defer closeOK(t, "subscriber", s2)
		subs = append(subs, s2)
	}
	hold := 2*f.AckWait + f.AckWait/2
	watch(t, subs, hold, nil, settle)
	controlBack := watch(t, subs, f.RedeliveryTimeout, func() bool { return controls > 1 }, settle)
	close(stop)
	if err := <-beats; err != nil {
		t.Fatalf("InProgress: %v", err)
	}
	if keptAgain > 0 {
		t.Fatalf("message kept alive with InProgress was delivered again %d time(s) within %s", keptAgain, hold)
	}
	if !controlBack {
		t.Fatalf("the control message held without InProgress did not come back within %s: the case cannot tell InProgress from a slow redelivery (is Features.AckWait right?)", hold+f.RedeliveryTimeout)
	}
	ack(t, held)
}

// fetchAndDie publishes n messages, fetches them all with a subscriber of
// group "g" and closes it without settling any: the sent messages and
// the deliveries it left.
func fetchAndDie(t *testing.T, env Env, f Features, prefix string, n int) (sent, first []*broker.Message) {
	p := newPub(t, env)
	defer closeOK(t, "publisher", p)
	sent = makeMsgs(env.Topic, prefix, n, nil)
	publish(t, p, sent...)
	s1 := newSub(t, env, "g")
	first = collect(t, s1, f.DeliveryTimeout, untilIDs(sent), nil)
	closeOK(t, "dying subscriber", s1)
	if miss := missing(sent, first); len(miss) > 0 {
		t.Fatalf("first subscriber got %d of %d messages", len(sent)-len(miss), len(sent))
	}
	return sent, first
}

// testConsumerDeath: a subscriber fetches and dies (Close without
// settling); another subscriber of the group gets every message.
func testConsumerDeath(t *testing.T, env Env, f Features) {
	sent, _ := fetchAndDie(t, env, f, "death", 10)

	s2 := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s2)
	got := collect(t, s2, f.RedeliveryTimeout+f.DeliveryTimeout, untilIDs(sent), ackAll(t))
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
	first := collect(t, s1, f.DeliveryTimeout, untilIDs(sent), nil)
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
	got := collect(t, s2, f.RedeliveryTimeout+f.DeliveryTimeout, untilIDs(rest), ackAll(t))
	if miss := missing(rest, got); len(miss) > 0 {
		t.Fatalf("%d of %d unacked messages never redelivered", len(miss), len(rest))
	}
	for _, m := range got {
		if acked[m.ID] {
			t.Errorf("acked message %s was delivered again after Close", m.ID)
		}
	}
	noneBack(t, s2, f, sent[:5], "acked")
}

// testDeliveryLost: the deliveries a closed subscriber left unsettled
// report broker.ErrDeliveryLost from InProgress (once Close has taken
// effect; from then on their Lost channel is closed, where the Acker is a
// broker.LostNotifier), Ack, Nak and Term, and those calls change
// nothing: every message comes back to the group's next subscriber, the
// acked one and the terminated one included.
func testDeliveryLost(t *testing.T, env Env, f Features) {
	sent, first := fetchAndDie(t, env, f, "lost", 4)
	got := byID(first)
	m := got[sent[0].ID]
	ctx := ctxFor(t, f.RedeliveryTimeout)
	for {
		err := m.Acker.InProgress(ctx)
		if errors.Is(err, broker.ErrDeliveryLost) {
			break
		}
		if err != nil && ctx.Err() == nil {
			t.Fatalf("InProgress of a delivery of a closed subscriber = %v, want an error wrapping broker.ErrDeliveryLost", err)
		}
		if ctx.Err() != nil {
			t.Fatalf("InProgress of a delivery of a closed subscriber still %v after %s, want an error wrapping broker.ErrDeliveryLost", err, f.RedeliveryTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ln, ok := m.Acker.(broker.LostNotifier); ok {
		select {
		case <-ln.Lost():
		default:
			t.Error("the Acker is a broker.LostNotifier, and its Lost channel is not closed for a delivery InProgress reports lost")
		}
	}
	sctx := ctxFor(t, 30*time.Second)
	for i, settle := range []struct {
		name string
		call func(a broker.Acker) error
	}{
		{"Ack", func(a broker.Acker) error { return a.Ack(sctx) }},
		{"Nak", func(a broker.Acker) error { return a.Nak(sctx, 0) }},
		{"Term", func(a broker.Acker) error { return a.Term(sctx, "lost") }},
	} {
		if err := settle.call(got[sent[i+1].ID].Acker); !errors.Is(err, broker.ErrDeliveryLost) {
			t.Errorf("%s of a delivery of a closed subscriber = %v, want an error wrapping broker.ErrDeliveryLost", settle.name, err)
		}
	}

	s2 := newSub(t, env, "g")
	defer closeOK(t, "subscriber", s2)
	again := collect(t, s2, f.RedeliveryTimeout+f.DeliveryTimeout, untilIDs(sent), ackAll(t))
	if miss := missing(sent, again); len(miss) > 0 {
		t.Fatalf("%d of %d lost deliveries never came back (a lost Ack, Nak or Term settled them?): %v", len(miss), len(sent), miss)
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
	got := collect(t, s, f.DeliveryTimeout, untilIDs(sent), ackAll(t))
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
	deadline := time.Now().Add(f.RedeliveryTimeout + f.DeliveryTimeout)
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
	// A rebalance may hand a few messages to both; a group whose members
	// each get everything does not split anything.
	both := 0
	for _, m := range sent {
		if got[0][m.ID] > 0 && got[1][m.ID] > 0 {
			both++
		}
	}
	if 2*both > len(sent) {
		t.Fatalf("group did not split the work: %d of %d messages went to both subscribers", both, len(sent))
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
		got := collect(t, s, f.DeliveryTimeout, untilIDs(sent), ackAll(t))
		if miss := missing(sent, got); len(miss) > 0 {
			t.Errorf("%s got %d of %d messages", name, len(sent)-len(miss), len(sent))
		}
	}
}
