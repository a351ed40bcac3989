package streamsbroker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
)

// conformanceAckWait is the suite's ack wait: short, so the cases that
// wait past it stay short.
const conformanceAckWait = time.Second

// TestAdapter runs the shared conformance suite and this adapter's own
// cases on the shared single node and on a 3-master Redis Cluster of the
// test's own (every script's keys in one slot).
func TestAdapter(t *testing.T) {
	cases := []struct {
		name string
		fn   func(t *testing.T, c redis.UniversalClient)
	}{
		{"Conformance", testConformance},
		{"DeliveryLimitDeadLettersOnce", testDeliveryLimit},
		{"NakDelay", testNakDelay},
		{"InProgressAndLostDelivery", testInProgressLost},
		{"Dedup", testDedup},
		{"MaxLenRefusesNeverDrops", testMaxLen},
		{"TrimKeepsWhatAGroupNeeds", testTrim},
		{"PendingEntriesTrimmedElsewhereAreReported", testExternalTrim},
		{"CloseHandsBack", testCloseHandsBack},
		{"TermDeadLetter", testTermDeadLetter},
		{"ForeignEntries", testForeignEntries},
		{"GroupDeletedIsRecreated", testGroupRecreated},
		{"Lag", testLag},
		{"QueuedAcksFlushed", testQueuedAcks},
		{"ReadAheadKeepsItsEntries", testReadAhead},
		{"FetchReturnsAtMostMax", testFetchMax},
	}
	for _, target := range []string{"single", "cluster"} {
		t.Run(target, func(t *testing.T) {
			var c redis.UniversalClient
			if target == "cluster" {
				c = clusterClient(t)
			} else {
				c = sharedClient(t)
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					// The conformance suite checks for leaked goroutines
					// after each case, so it runs alone; the adapter's own
					// cases (no leak check of their own) then run together.
					if tc.name != "Conformance" {
						t.Parallel()
					}
					tc.fn(t, c)
				})
			}
			if cc, ok := c.(*redis.ClusterClient); ok {
				t.Run("KeysShareTheStreamsSlot", func(t *testing.T) { testKeySlots(t, cc) })
			}
		})
	}
}

// testConformance: the shared suite with the adapter's defaults except a
// 1s ack wait and a 100ms claim interval.
func testConformance(t *testing.T, c redis.UniversalClient) {
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		stream := newStream(t, c)
		return brokertest.Env{
			Topic: stream,
			NewPublisher: func(t testing.TB) broker.Publisher {
				p, err := streamsbroker.NewPublisher(streamsbroker.PublisherConfig{Client: c})
				if err != nil {
					t.Fatal(err)
				}
				return p
			},
			NewSubscriber: func(t testing.TB, group string) broker.Subscriber {
				s, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{
					Client: c, Stream: stream, Group: group,
					AckWait: conformanceAckWait, ClaimInterval: 100 * time.Millisecond,
				})
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
		}
	}, brokertest.Features{
		OrderedByKey:        true,
		ConsumerGroups:      true,
		NativeNakDelay:      true,
		DeliveryCount:       true,
		RedeliverAfterClose: true,
		// Not LostAfterClose: a closed subscriber's entries stay pending
		// under its consumer name until reclaimed, and XACK settles them
		// from anywhere; InProgress reports ErrDeliveryLost once another
		// consumer reclaimed the entry (testInProgressLost).
		MaxPayload: 1 << 20,
		AckWait:    conformanceAckWait,
	})
}

// testDeliveryLimit: with MaxDeliver 2, an entry left unsettled on both
// deliveries is moved to the dead-letter stream once (with its fields and
// the reason) and acked, never delivered a third time, however many
// reclaims follow.
func testDeliveryLimit(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	s := newSub(t, c, stream, "g", func(cfg *streamsbroker.SubscriberConfig) { cfg.MaxDeliver = 2 })
	if s.MaxDeliveries() != 2 {
		t.Fatalf("MaxDeliveries = %d, want 2", s.MaxDeliveries())
	}
	publish(t, p, stream, "poison", "fine")
	got := fetch(t, s, 2, 10*time.Second)
	for _, m := range got {
		if m.ID == "fine" {
			if err := m.Acker.Ack(bg(t)); err != nil {
				t.Fatal(err)
			}
		} else if m.Delivery != 1 {
			t.Fatalf("first delivery has Delivery %d", m.Delivery)
		}
	}
	again := fetch(t, s, 1, 10*time.Second) // reclaimed after the ack wait
	if len(again) != 1 || again[0].ID != "poison" || again[0].Delivery != 2 {
		t.Fatalf("second delivery: %+v", again)
	}
	// The last delivery stays unsettled: the next reclaim dead-letters it.
	if extra := fetch(t, s, 1, 2*time.Second); len(extra) != 0 {
		t.Fatalf("delivered past MaxDeliver: %s delivery %d", extra[0].ID, extra[0].Delivery)
	}
	dlq := streamsbroker.DeadLetterStream(stream)
	entries, err := c.XRange(bg(t), dlq, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("dead-letter stream has %d entries, want 1", len(entries))
	}
	v := entries[0].Values
	if v[streamsbroker.FieldID] != "poison" || v[streamsbroker.FieldPayload] != "payload of poison" ||
		v[streamsbroker.FieldDeadLetterStream] != stream || v[streamsbroker.FieldDeadLetterEntry] != entryID(t, again[0]) ||
		!strings.Contains(fmt.Sprint(v[streamsbroker.FieldDeadLetterReason]), "delivery limit") {
		t.Fatalf("dead-letter entry %v", v)
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Fatalf("%d entries still pending after the dead letter", n)
	}
	if st := s.Stats(); st.DeadLettered != 1 || st.Redelivered != 1 || st.Delivered != 2 {
		t.Fatalf("stats %+v", st)
	}
	// A late settle of the last delivery changes nothing.
	if err := again[0].Acker.Ack(bg(t)); err != nil {
		t.Fatal(err)
	}
	if n := xlen(t, c, dlq); n != 1 {
		t.Fatalf("dead-letter stream has %d entries after more reclaims, want 1", n)
	}
}

// testNakDelay: a nak'ed entry comes back no sooner than its delay, with
// its delivery count up by one; a delay above AckWait is cut to AckWait
// (it comes back, instead of staying idle forever).
func testNakDelay(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	s := newSub(t, c, stream, "g", func(cfg *streamsbroker.SubscriberConfig) { cfg.AckWait = 2 * time.Second })
	publish(t, p, stream, "m")
	m := fetch(t, s, 1, 10*time.Second)[0]
	nakAt := time.Now()
	if err := m.Acker.Nak(bg(t), time.Second); err != nil {
		t.Fatal(err)
	}
	back := fetch(t, s, 1, 10*time.Second)
	if len(back) != 1 {
		t.Fatal("not redelivered after Nak(1s)")
	}
	if d := time.Since(nakAt); d < time.Second-50*time.Millisecond {
		t.Fatalf("redelivered %s after Nak(1s)", d)
	}
	if back[0].Delivery != 2 {
		t.Fatalf("Delivery %d after one nak, want 2", back[0].Delivery)
	}
	if err := back[0].Acker.Nak(bg(t), time.Hour); err != nil {
		t.Fatal(err)
	}
	third := fetch(t, s, 1, 10*time.Second)
	if len(third) != 1 || third[0].Delivery != 3 {
		t.Fatalf("Nak(1h) with a 2s ack wait: %+v, want a third delivery within AckWait", third)
	}
}

// testInProgressLost: InProgress keeps an entry from being reclaimed past
// the ack wait; once a delivery has gone idle past it and another consumer
// reclaimed it, the first delivery's InProgress reports ErrDeliveryLost
// and its Nak does not take the entry back.
func testInProgressLost(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	second := func(cfg *streamsbroker.SubscriberConfig) { cfg.AckWait = time.Second }
	s1 := newSub(t, c, stream, "g", second)
	s2 := newSub(t, c, stream, "g", second)
	publish(t, p, stream, "m")
	m := fetch(t, s1, 1, 10*time.Second)[0]
	for range 8 { // every quarter of the ack wait, for twice the ack wait
		time.Sleep(250 * time.Millisecond)
		if err := m.Acker.InProgress(bg(t)); err != nil {
			t.Fatalf("InProgress: %v", err)
		}
	}
	if got := fetch(t, s2, 1, 300*time.Millisecond); len(got) != 0 {
		t.Fatal("an entry kept alive with InProgress was reclaimed")
	}
	// Now let it go idle past the ack wait: s2 reclaims it.
	stolen := fetch(t, s2, 1, 10*time.Second)
	if len(stolen) != 1 || stolen[0].Delivery != 2 {
		t.Fatalf("reclaim: %+v", stolen)
	}
	if err := m.Acker.InProgress(bg(t)); !errors.Is(err, streamsbroker.ErrDeliveryLost) || !errors.Is(err, broker.ErrDeliveryLost) {
		t.Fatalf("InProgress of a reclaimed delivery: %v, want ErrDeliveryLost", err)
	}
	if err := m.Acker.Nak(bg(t), 0); err != nil {
		t.Fatal(err)
	}
	// s2 keeps it: its InProgress still works, and nobody else gets it.
	if err := stolen[0].Acker.InProgress(bg(t)); err != nil {
		t.Fatalf("InProgress of the live delivery after the stale one's Nak: %v", err)
	}
	if got := fetch(t, s1, 1, 300*time.Millisecond); len(got) != 0 {
		t.Fatal("the stale delivery's Nak took the entry back")
	}
	if err := stolen[0].Acker.Ack(bg(t)); err != nil {
		t.Fatal(err)
	}
}

// testDedup: the same id published again within the window adds nothing
// (also concurrently and within one batch); with NoDedup every publish is
// an entry.
func testDedup(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	publish(t, p, stream, "a", "b")
	publish(t, p, stream, "a")
	publish(t, p, stream, "b", "c", "c")
	done := make(chan struct{})
	for range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			_ = p.Publish(bg(t), &broker.Message{ID: "d", Topic: stream})
		}()
	}
	for range 8 {
		<-done
	}
	if n := xlen(t, c, stream); n != 4 {
		t.Fatalf("stream has %d entries, want 4 (a, b, c, d once each)", n)
	}
	ttl, err := c.PTTL(bg(t), "{"+stream+"}:idem-dedup:a").Result()
	if err != nil || ttl <= 0 || ttl > streamsbroker.DefaultDedupWindow {
		t.Fatalf("dedup key TTL %s, %v", ttl, err)
	}
	raw := newPub(t, c, func(cfg *streamsbroker.PublisherConfig) { cfg.NoDedup = true })
	publish(t, raw, stream, "a", "a")
	if n := xlen(t, c, stream); n != 6 {
		t.Fatalf("stream has %d entries after two NoDedup publishes, want 6", n)
	}
}

// testMaxLen: a stream at MaxLen refuses the next publish with
// ErrStreamFull (idem.ErrCapacity) and keeps every entry.
func testMaxLen(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, func(cfg *streamsbroker.PublisherConfig) { cfg.MaxLen = 3 })
	publish(t, p, stream, "1", "2", "3")
	err := p.Publish(bg(t), &broker.Message{ID: "4", Topic: stream})
	if !errors.Is(err, streamsbroker.ErrStreamFull) || !errors.Is(err, idem.ErrCapacity) {
		t.Fatalf("publish to a full stream: %v, want ErrStreamFull", err)
	}
	if n := xlen(t, c, stream); n != 3 {
		t.Fatalf("stream has %d entries, want 3", n)
	}
	// A duplicate of a stored id is still answered (nothing to add).
	if err := p.Publish(bg(t), &broker.Message{ID: "2", Topic: stream}); err != nil {
		t.Fatalf("re-publish of a stored id to a full stream: %v", err)
	}
}

// testTrim: the trim removes what every group acked and nothing else: not
// an entry pending in one group, not one a group has not read yet.
func testTrim(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	var ids []string
	for i := range 10 {
		ids = append(ids, fmt.Sprint(i))
	}
	publish(t, p, stream, ids...)
	trimEvery := func(cfg *streamsbroker.SubscriberConfig) {
		cfg.TrimInterval = 50 * time.Millisecond
		cfg.AckWait = time.Minute
		cfg.AckSync = true // the acks are in Redis before the trim runs
	}
	a := newSub(t, c, stream, "a", trimEvery)
	b := newSub(t, c, stream, "b", trimEvery)
	for _, m := range fetch(t, a, 10, 10*time.Second) {
		if err := m.Acker.Ack(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
	// b reads 6 entries, acks 0-2 and 5, keeps 3 and 4 pending, has not
	// read 6-9.
	bs := fetch(t, b, 6, 10*time.Second)
	for _, m := range bs {
		if m.ID != "3" && m.ID != "4" {
			if err := m.Acker.Ack(bg(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(100 * time.Millisecond)
	fetch(t, a, 1, 200*time.Millisecond) // runs the trim
	left, err := c.XRange(bg(t), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 7 || left[0].Values[streamsbroker.FieldID] != "3" {
		t.Fatalf("after the trim %d entries remain starting at %v, want 7 from id 3 (b's oldest pending)", len(left), left[0].Values[streamsbroker.FieldID])
	}
	if a.Stats().Trimmed+b.Stats().Trimmed != 3 {
		t.Fatalf("trimmed %d + %d, want 3", a.Stats().Trimmed, b.Stats().Trimmed)
	}
	for _, m := range bs {
		if err := m.Acker.Ack(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
	rest := fetch(t, b, 4, 10*time.Second)
	for _, m := range rest {
		if err := m.Acker.Ack(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
	if len(rest) != 4 {
		t.Fatalf("b read %d of the 4 entries it had not read, after the trim", len(rest))
	}
	time.Sleep(100 * time.Millisecond)
	fetch(t, b, 1, 200*time.Millisecond)
	if n := xlen(t, c, stream); n > 1 {
		t.Fatalf("%d entries left once both groups acked everything, want at most the last delivered", n)
	}
}

// testExternalTrim: entries trimmed by someone else (XTRIM MAXLEN) while
// pending are not silently skipped: the reclaim counts them as lost and
// logs them.
func testExternalTrim(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	s := newSub(t, c, stream, "g", nil)
	publish(t, p, stream, "1", "2", "3")
	fetch(t, s, 3, 10*time.Second) // all pending, none acked
	if err := c.XTrimMaxLen(bg(t), stream, 1).Err(); err != nil {
		t.Fatal(err)
	}
	back := fetch(t, s, 1, 10*time.Second)
	if len(back) != 1 || back[0].ID != "3" {
		t.Fatalf("reclaim after the trim: %+v", back)
	}
	if st := s.Stats(); st.Lost != 2 {
		t.Fatalf("Stats.Lost = %d, want 2", st.Lost)
	}
}

// testCloseHandsBack: Close makes the subscriber's unsettled deliveries
// reclaimable at once (AckWait is a minute here) and removes the consumer
// from the group once it holds nothing.
func testCloseHandsBack(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	long := func(cfg *streamsbroker.SubscriberConfig) { cfg.AckWait = time.Minute }
	s1 := newSub(t, c, stream, "g", long)
	publish(t, p, stream, "1", "2", "3")
	got := fetch(t, s1, 3, 10*time.Second)
	if err := got[0].Acker.Ack(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := newSub(t, c, stream, "g", long)
	back := fetch(t, s2, 2, 5*time.Second)
	if len(back) != 2 {
		t.Fatalf("%d of 2 unsettled deliveries handed back at Close", len(back))
	}
	for _, m := range back {
		if m.Delivery != 2 {
			t.Errorf("%s handed back with Delivery %d", m.ID, m.Delivery)
		}
		if err := m.Acker.Ack(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	cs, err := c.XInfoConsumers(bg(t), stream, "g").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, ci := range cs {
		if ci.Name == s2.Consumer() {
			t.Fatalf("consumer %s with nothing pending still in the group after Close", ci.Name)
		}
	}
}

// testTermDeadLetter: with DeadLetterOnTerm, Term copies the entry to the
// dead-letter stream with its reason once (a second Term does nothing).
func testTermDeadLetter(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	s := newSub(t, c, stream, "g", func(cfg *streamsbroker.SubscriberConfig) { cfg.DeadLetterOnTerm = true })
	publish(t, p, stream, "bad")
	m := fetch(t, s, 1, 10*time.Second)[0]
	for range 2 {
		if err := m.Acker.Term(bg(t), "unparseable"); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := c.XRange(bg(t), streamsbroker.DeadLetterStream(stream), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Values[streamsbroker.FieldDeadLetterReason] != "unparseable" || entries[0].Values[streamsbroker.FieldID] != "bad" {
		t.Fatalf("dead-letter entries %+v", entries)
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Fatalf("%d pending after Term", n)
	}
}

// testForeignEntries: an entry written by another producer (no idem
// fields) is delivered with a stable id derived from its entry id and its
// fields as headers.
func testForeignEntries(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	eid, err := c.XAdd(bg(t), &redis.XAddArgs{Stream: stream, Values: []string{"order", "42", "h:x", "y"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	s := newSub(t, c, stream, "g", nil)
	m := fetch(t, s, 1, 10*time.Second)[0]
	if m.ID != "redis:"+stream+":"+eid || m.Headers["order"] != "42" || m.Headers["x"] != "y" || len(m.Payload) != 0 || m.Key != nil {
		t.Fatalf("foreign entry delivered as %+v", m)
	}
	if m.PublishedAt.IsZero() || time.Since(m.PublishedAt) > time.Minute {
		t.Fatalf("PublishedAt %s", m.PublishedAt)
	}
}

// testGroupRecreated: a group deleted under a running subscriber (or lost
// with a Redis restarted without its data) is created again at the start
// of the stream, and consumption goes on.
func testGroupRecreated(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	s := newSub(t, c, stream, "g", nil)
	publish(t, p, stream, "1")
	m := fetch(t, s, 1, 10*time.Second)[0]
	if err := m.Acker.Ack(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.XGroupDestroy(bg(t), stream, "g").Err(); err != nil {
		t.Fatal(err)
	}
	publish(t, p, stream, "2")
	got := fetch(t, s, 2, 10*time.Second)
	if len(got) != 2 {
		t.Fatalf("after the group was deleted: %d of 2 entries delivered (the new group starts at the first entry)", len(got))
	}
}

// testKeySlots: the dead-letter stream and the dedup keys of a stream are
// in its cluster slot, with and without a hash tag in its name, so the
// scripts that touch them together never meet CROSSSLOT.
func testKeySlots(t *testing.T, c *redis.ClusterClient) {
	for _, stream := range []string{"orders", "a:b:c", "{tenant-7}.orders", "x{t}y"} {
		slot := func(k string) int64 {
			n, err := c.ClusterKeySlot(bg(t), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		want := slot(stream)
		prefix := streamsbroker.DeadLetterStream(stream)
		prefix = prefix[:len(prefix)-len(":idem-dead-letter")]
		for _, k := range []string{streamsbroker.DeadLetterStream(stream), prefix + ":idem-dedup:msg-1"} {
			if got := slot(k); got != want {
				t.Errorf("%s is in slot %d, its stream %s in %d", k, got, stream, want)
			}
		}
	}
}

// testLag: Lag counts the group's unread and pending entries, before and
// after the group exists, and after an XDEL makes Redis unsure of the lag.
// Another consumer of the group reads (XREADGROUP directly), so what is
// pending and unread is exactly known.
func testLag(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	publish(t, p, stream, "1", "2", "3", "4", "5")
	s := newSub(t, c, stream, "g", nil)
	lag := func() int64 {
		t.Helper()
		n, err := s.Lag(bg(t))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := lag(); n != 5 {
		t.Fatalf("lag before the group exists: %d, want 5", n)
	}
	if err := c.XGroupCreate(bg(t), stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	read, err := c.XReadGroup(bg(t), &redis.XReadGroupArgs{Group: "g", Consumer: "other", Streams: []string{stream, ">"}, Count: 3, Block: -1}).Result()
	if err != nil || len(read[0].Messages) != 3 {
		t.Fatalf("read 3: %v, %v", read, err)
	}
	if err := c.XAck(bg(t), stream, "g", read[0].Messages[0].ID).Err(); err != nil {
		t.Fatal(err)
	}
	if n := lag(); n != 4 {
		t.Fatalf("lag with 2 unread and 2 pending: %d, want 4", n)
	}
	// An XDEL of an unread entry leaves Redis unable to tell the lag.
	all, err := c.XRange(bg(t), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.XDel(bg(t), stream, all[3].ID).Err(); err != nil {
		t.Fatal(err)
	}
	if n := lag(); n != 3 {
		t.Fatalf("lag after an XDEL of an unread entry: %d, want 3", n)
	}
}

// testQueuedAcks: acks are queued (Ack returns before Redis has them) and
// flushed in batches; once Close returns every one is in Redis (nothing
// pending, nothing handed back to be redelivered).
func testQueuedAcks(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	var ids []string
	for i := range 300 {
		ids = append(ids, fmt.Sprint(i))
	}
	publish(t, p, stream, ids...)
	s := newSub(t, c, stream, "g", func(cfg *streamsbroker.SubscriberConfig) { cfg.AckWait = time.Minute })
	got := fetch(t, s, 300, 10*time.Second)
	for _, m := range got {
		if err := m.Acker.Ack(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Fatalf("%d of 300 acked entries still pending after Close", n)
	}
	if st := s.Stats(); st.AckErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// testReadAhead: after a Fetch that returned entries, the next read is
// already on its way (its entries are delivered to this consumer); when
// the next Fetch takes them after more than half the ack wait, their idle
// time starts again, so another consumer's reclaim does not take them
// while the caller works on them.
func testReadAhead(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	publish(t, p, stream, "1", "2", "3")
	twoSeconds := func(cfg *streamsbroker.SubscriberConfig) { cfg.AckWait = 2 * time.Second }
	s1 := newSub(t, c, stream, "g", twoSeconds)
	s2 := newSub(t, c, stream, "g", twoSeconds)
	first := fetch(t, s1, 1, 10*time.Second)
	if len(first) != 1 || first[0].ID != "1" {
		t.Fatalf("first fetch: %+v", first)
	}
	time.Sleep(1200 * time.Millisecond) // past half the ack wait
	second := fetch(t, s1, 1, 10*time.Second)
	if len(second) != 1 || second[0].ID != "2" || second[0].Delivery != 1 {
		t.Fatalf("read-ahead entry: %+v", second)
	}
	// 2.3s after it was read, 1.1s after its idle time started again: past
	// the ack wait only if it had not.
	time.Sleep(1100 * time.Millisecond)
	for _, m := range fetch(t, s2, 2, 300*time.Millisecond) {
		if m.ID == "2" {
			t.Fatalf("entry 2 reclaimed by another consumer (delivery %d) while its read-ahead delivery was in hand", m.Delivery)
		}
	}
	for _, m := range append(first, second...) {
		if err := m.Acker.Ack(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// testFetchMax: Fetch returns at most max entries, also when what was read
// ahead (for a larger max) is more; the rest comes with the next calls, in
// order, each entry once.
func testFetchMax(t *testing.T, c redis.UniversalClient) {
	stream := newStream(t, c)
	p := newPub(t, c, nil)
	var ids []string
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("%02d", i))
	}
	publish(t, p, stream, ids...)
	s := newSub(t, c, stream, "g", func(cfg *streamsbroker.SubscriberConfig) { cfg.AckWait = time.Minute })
	var got []string
	for _, max := range []int{8, 2, 3, 1, 10, 10} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		msgs, err := s.Fetch(ctx, max)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) > max {
			t.Fatalf("Fetch(%d) returned %d messages", max, len(msgs))
		}
		for _, m := range msgs {
			got = append(got, m.ID)
		}
		if len(got) == len(ids) {
			break
		}
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("fetched %v, want %v", got, ids)
	}
}
