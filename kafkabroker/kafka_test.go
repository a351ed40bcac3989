package kafkabroker

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestConfigValidate(t *testing.T) {
	b := []string{"127.0.0.1:9092"}
	tests := []struct {
		name string
		err  error
	}{
		{"publisher ok", PublisherConfig{Brokers: b}.Validate()},
		{"subscriber ok", SubscriberConfig{Brokers: b, Group: "g", Topics: []string{"t"}}.Validate()},
	}
	for _, tc := range tests {
		if tc.err != nil {
			t.Errorf("%s: %v", tc.name, tc.err)
		}
	}
	bad := []struct {
		name string
		err  error
	}{
		{"publisher no brokers", PublisherConfig{}.Validate()},
		{"publisher tiny batch", PublisherConfig{Brokers: b, MaxMessageBytes: 10}.Validate()},
		{"publisher cancel in flight with transactions", PublisherConfig{Brokers: b, TransactionalID: "x", CancelInFlight: true}.Validate()},
		{"subscriber no group", SubscriberConfig{Brokers: b, Topics: []string{"t"}}.Validate()},
		{"subscriber no topics", SubscriberConfig{Brokers: b, Group: "g"}.Validate()},
		{"subscriber heartbeat >= session", SubscriberConfig{Brokers: b, Group: "g", Topics: []string{"t"}, SessionTimeout: time.Second, HeartbeatInterval: time.Second}.Validate()},
		{"subscriber negative nak delay", SubscriberConfig{Brokers: b, Group: "g", Topics: []string{"t"}, MaxNakDelay: -1}.Validate()},
		{"subscriber negative unsettled", SubscriberConfig{Brokers: b, Group: "g", Topics: []string{"t"}, MaxUnsettled: -1}.Validate()},
	}
	for _, tc := range bad {
		if !errors.Is(tc.err, idem.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", tc.name, tc.err)
		}
	}
	if _, err := NewSubscriber(SubscriberConfig{}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("NewSubscriber(zero config): %v", err)
	}
	w := SubscriberConfig{SessionTimeout: time.Second, RebalanceTimeout: 2 * time.Second, MaxNakDelay: 3 * time.Second,
		CommitInterval: time.Second, CommitTimeout: time.Second}.RedeliveryWindow()
	if w != 8*time.Second {
		t.Errorf("RedeliveryWindow = %s, want 8s", w)
	}
}

func TestPublishRejectsBadMessages(t *testing.T) {
	c := newCluster(t)
	p := newPub(t, c)
	ctx := context.Background()
	for name, m := range map[string]*broker.Message{
		"nil":      nil,
		"no id":    {Topic: "t"},
		"no topic": {ID: "x"},
	} {
		if err := p.Publish(ctx, m); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestHeadersAndPartitioning: headers and key round-trip, the id travels in
// its header and not in Headers, and a keyless message's duplicates land in
// the partition its id hashes to.
func TestHeadersAndPartitioning(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 8)
	p := newPub(t, c)
	s := newSub(t, fastSub(c, uniq("g"), topic))

	keyed := &broker.Message{ID: "keyed", Topic: topic, Key: []byte("k"), Payload: []byte("v"),
		Headers: map[string]string{broker.HeaderTraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": ""}}
	var dups []*broker.Message
	for i := range 5 {
		dups = append(dups, &broker.Message{ID: "same-id", Topic: topic, Payload: fmt.Appendf(nil, "copy-%d", i)})
	}
	publish(t, p, keyed)
	publish(t, p, dups...)
	got := fetchN(t, s, 6, 30*time.Second)
	ackAll(t, got)
	parts := map[int32]bool{}
	for _, m := range got {
		if _, ok := m.Headers[broker.HeaderMessageID]; ok {
			t.Errorf("%s: id header leaked into Headers", m.ID)
		}
		a := m.Acker.(*acker)
		if m.ID == "keyed" {
			if !bytes.Equal(m.Key, keyed.Key) || string(m.Payload) != "v" || m.Headers[broker.HeaderTraceParent] != keyed.Headers[broker.HeaderTraceParent] {
				t.Errorf("keyed message came back as %+v", m)
			}
			if v, ok := m.Headers["x"]; !ok || v != "" {
				t.Errorf("empty header value lost: %q %v", v, ok)
			}
			continue
		}
		if m.Key != nil {
			t.Errorf("keyless message came back with key %q", m.Key)
		}
		parts[a.p.partition] = true
	}
	if len(parts) != 1 {
		t.Errorf("5 publishes of one id landed in %d partitions, want 1", len(parts))
	}
}

// TestContiguousPrefixCommit: acking offsets 0 and 2 commits 1; acking 1
// then commits 3.
func TestContiguousPrefixCommit(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p := newPub(t, c)
	group := uniq("g")
	cfg := fastSub(c, group, topic)
	cfg.CommitInterval = time.Hour // commit only when the test says so
	s := newSub(t, cfg)

	publish(t, p, msgs(topic, "m", 3)...)
	got := fetchN(t, s, 3, 30*time.Second)
	ctx := context.Background()
	ack := func(i int) {
		if err := got[i].Acker.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ack(0)
	ack(2)
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if at := committed(t, adm, group, topic, 0); at != 1 {
		t.Fatalf("after acking offsets 0 and 2: committed %d, want 1", at)
	}
	ack(1)
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if at := committed(t, adm, group, topic, 0); at != 3 {
		t.Fatalf("after acking offset 1 too: committed %d, want 3", at)
	}
}

// TestNakRedeliversSameMessage: a nak'd message comes back with the same id
// and payload, Delivery 2, no earlier than the delay, and holds the commit
// until it is acked.
func TestNakRedeliversSameMessage(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p := newPub(t, c)
	group := uniq("g")
	cfg := fastSub(c, group, topic)
	cfg.CommitInterval = time.Hour
	s := newSub(t, cfg)
	publish(t, p, msgs(topic, "n", 2)...)
	got := fetchN(t, s, 2, 30*time.Second)
	ctx := context.Background()
	const delay = 300 * time.Millisecond
	nakAt := time.Now()
	if err := got[0].Acker.Nak(ctx, delay); err != nil {
		t.Fatal(err)
	}
	if err := got[0].Acker.Ack(ctx); err != nil { // settled by the Nak: no-op
		t.Fatal(err)
	}
	ackAll(t, got[1:])
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if at := committed(t, adm, group, topic, 0); at > 0 {
		t.Fatalf("committed %d past the nak'd offset 0", at)
	}
	again := fetchN(t, s, 1, 30*time.Second)[0]
	if since := time.Since(nakAt); since < delay {
		t.Errorf("redelivered after %s, before the %s delay", since, delay)
	}
	if again.ID != got[0].ID || !bytes.Equal(again.Payload, got[0].Payload) || again.Delivery != 2 {
		t.Fatalf("redelivery %s/%q delivery %d, want %s/%q delivery 2", again.ID, again.Payload, again.Delivery, got[0].ID, got[0].Payload)
	}
	ackAll(t, []*broker.Message{again})
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if at := committed(t, adm, group, topic, 0); at != 2 {
		t.Fatalf("committed %d after acking the redelivery, want 2", at)
	}
}

// TestConsumerDeathRedelivers: a member that closes without settling loses
// its messages to the next member, and what it acked stays acked.
func TestConsumerDeathRedelivers(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 3)
	p := newPub(t, c)
	group := uniq("g")
	sent := msgs(topic, "d", 30)
	publish(t, p, sent...)

	s1 := newSub(t, fastSub(c, group, topic))
	first := fetchN(t, s1, 30, 30*time.Second)
	acked := map[string]bool{}
	for _, m := range first {
		if m.Acker.(*acker).e.off < 2 { // a contiguous prefix of each partition
			acked[m.ID] = true
			ackAll(t, []*broker.Message{m})
		}
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := newSub(t, fastSub(c, group, topic))
	rest := fetchN(t, s2, 30-len(acked), 30*time.Second)
	for _, m := range rest {
		if acked[m.ID] {
			t.Errorf("acked message %s delivered again", m.ID)
		}
	}
	ackAll(t, rest)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if extra, err := s2.Fetch(ctx, 10); len(extra) > 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after all redelivered: %d more, err %v", len(extra), err)
	}
}

// TestRevokedSettlesIgnored: after Close (which revokes everything), acking
// and naking old deliveries changes nothing and reports ErrDeliveryLost
// (broker.ErrDeliveryLost): the group's next member gets them again.
func TestRevokedSettlesIgnored(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p := newPub(t, c)
	group := uniq("g")
	s := newSub(t, fastSub(c, group, topic))
	publish(t, p, msgs(topic, "r", 3)...)
	got := fetchN(t, s, 3, 30*time.Second)
	ackAll(t, got[:1])
	select {
	case <-got[1].Acker.(broker.LostNotifier).Lost():
		t.Fatal("Lost() closed while the partition is assigned")
	default:
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	select {
	case <-got[1].Acker.(broker.LostNotifier).Lost():
	default:
		t.Fatal("Lost() of a delivery of a revoked partition is not closed")
	}
	if err := got[1].Acker.InProgress(ctx); err != ErrDeliveryLost || !errors.Is(err, broker.ErrDeliveryLost) {
		t.Fatalf("InProgress after Close = %v, want ErrDeliveryLost", err)
	}
	if err := got[1].Acker.Ack(ctx); !errors.Is(err, broker.ErrDeliveryLost) {
		t.Fatalf("Ack after Close = %v, want ErrDeliveryLost", err)
	}
	if err := got[2].Acker.Nak(ctx, 0); !errors.Is(err, broker.ErrDeliveryLost) {
		t.Fatalf("Nak after Close = %v, want ErrDeliveryLost", err)
	}
	if err := got[0].Acker.InProgress(ctx); err != nil {
		t.Fatalf("InProgress of a delivery acked before Close = %v, want nil", err)
	}
	if at := committed(t, adm, group, topic, 0); at != 1 {
		t.Fatalf("committed %d, want 1 (acks after close ignored)", at)
	}
	if _, err := s.Fetch(ctx, 1); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Fetch after Close: %v", err)
	}
}

// TestRebalanceMidStream: a second member joins while the first holds
// unsettled messages. Every message is delivered (nothing lost), everything
// the first member left unsettled reaches a member again (nothing was
// committed past it), and at the end the group's commits cover the topic.
func TestRebalanceMidStream(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	const parts, n = 4, 2000
	topic := createTopic(t, adm, parts)
	p := newPub(t, c)
	group := uniq("g")
	sent := msgs(topic, "rb", n)

	var mu sync.Mutex
	acked := map[string]int{}
	held := map[string]bool{} // never settled by member 0
	type heldMsg struct {
		off int64
		id  string
	}
	heldIn := map[int32][]heldMsg{} // member 0's held messages per partition
	acking := map[string]bool{}     // an Ack of it began (by either member)
	where := map[string]string{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	run := func(id int, s *Subscriber) {
		defer wg.Done()
		for k := 0; ; k++ {
			ms, err := s.Fetch(ctx, 50)
			if err != nil {
				return
			}
			for _, m := range ms {
				mu.Lock()
				a := m.Acker.(*acker)
				where[m.ID] += fmt.Sprintf(" m%d:p%d@%d", id, a.p.partition, a.e.off)
				if id == 0 && k%7 == 3 && !held[m.ID] && acked[m.ID] == 0 {
					held[m.ID] = true // the handler "hangs" on it
					heldIn[a.p.partition] = append(heldIn[a.p.partition], heldMsg{a.e.off, m.ID})
					mu.Unlock()
					continue
				}
				acking[m.ID] = true
				mu.Unlock()
				// Ack, then count: once the test sees every message
				// counted, every Ack has returned and the Commit below
				// covers it. Counting first left a window in which the
				// last Ack had not been made when the test committed
				// (its partition's commit stopped short of the end).
				_ = m.Acker.Ack(ctx)
				mu.Lock()
				acked[m.ID]++
				mu.Unlock()
			}
		}
	}
	s0, err := NewSubscriber(fastSub(c, group, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer s0.Close()
	// Every offset member 0 commits must stop at each message it held
	// that nobody has begun to ack: past one, that message would be lost
	// had no one else got it. (A partition can come back to member 0 after
	// member 1 acked what it held there: committing past that is right; a
	// check against the lowest offset it ever held failed on that at load
	// ~35, when kfake expelled members that missed their 1s session.)
	var violations []string // under mu
	s0.onCommitted = func(tp topicPartition, off int64) {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range heldIn[tp.partition] {
			if h.off < off && !acking[h.id] {
				violations = append(violations, fmt.Sprintf("member 0 committed partition %d at %d, past its unsettled offset %d (%s) that no one had acked", tp.partition, off, h.off, h.id))
			}
		}
	}
	wg.Add(1)
	go run(0, s0)
	publish(t, p, sent[:n/2]...)
	// Member 1 joins mid-stream: a cooperative rebalance moves partitions
	// away from member 0 while it holds unsettled messages.
	s1 := newSub(t, fastSub(c, group, topic))
	wg.Add(1)
	go run(1, s1)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s1.mu.Lock()
		n1 := len(s1.parts)
		s1.mu.Unlock()
		if n1 > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("member 1 never got partitions")
		}
	}
	s0.mu.Lock()
	revoked := parts - len(s0.parts)
	s0.mu.Unlock()
	if revoked == 0 {
		t.Fatal("no partition moved from member 0 to member 1")
	}
	for i := n / 2; i < n; i += 100 {
		publish(t, p, sent[i:i+100]...)
	}
	// Member 0 leaves: its held messages must go to member 1.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		seen := 0
		for _, m := range sent {
			if acked[m.ID] > 0 || held[m.ID] {
				seen++
			}
		}
		mu.Unlock()
		if seen == n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s0.Close(); err != nil {
		t.Logf("close member 0: %v", err)
	}
	for time.Now().Before(deadline) {
		mu.Lock()
		done := len(acked)
		mu.Unlock()
		if done == n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every message has been acked once, but member 1 may still be acking
	// redeliveries of messages member 0 acked before it left (counted
	// already): the partition it took over was committed only up to member
	// 0's first held message, and member 1's commit stops at its first
	// delivery not yet acked. Committing once here stopped short of the end
	// (CI: "partition 1: committed 518, end 547", the held message at 518
	// acked last, 519..546 still in member 1's loop). Commit until the
	// group's commits reach every partition's end, or the deadline: the
	// check below still fails if they never do.
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if err := s1.Commit(context.Background()); err != nil {
			t.Logf("commit: %v", err)
		}
		short := false
		ends.Each(func(o kadm.ListedOffset) {
			short = short || committed(t, adm, group, topic, o.Partition) != o.Offset
		})
		if !short || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	var lost []string
	for _, m := range sent {
		if acked[m.ID] == 0 {
			lost = append(lost, m.ID)
		}
	}
	if len(lost) > 0 {
		for _, id := range lost[:min(10, len(lost))] {
			t.Logf("lost %s held=%v deliveries:%s", id, held[id], where[id])
		}
		for i := int32(0); i < parts; i++ {
			t.Logf("partition %d committed %d", i, committed(t, adm, group, topic, i))
		}
		t.Fatalf("%d of %d messages never acked (e.g. %s); member 0 held %d", len(lost), n, lost[0], len(held))
	}
	if len(held) == 0 {
		t.Fatal("member 0 held nothing back: the test did not exercise unsettled messages")
	}
	for _, v := range violations { // mu is held from above
		t.Error(v)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if at := committed(t, adm, group, topic, o.Partition); at != o.Offset {
			t.Errorf("partition %d: committed %d, end %d", o.Partition, at, o.Offset)
		}
	})
	t.Logf("%d messages, %d held by member 0 and redelivered, %d duplicate acks", n, len(held), dupAcks(acked))
}

func dupAcks(m map[string]int) int {
	d := 0
	for _, v := range m {
		d += v - 1
	}
	return d
}

// TestTransactionalPublish: a transactional Publish that fails aborts the
// messages it already sent, so read_committed consumers never see them.
func TestTransactionalPublish(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), TransactionalID: uniq("tx"), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	ok1 := &broker.Message{ID: "ok1", Topic: topic, Payload: []byte("1")}
	huge := &broker.Message{ID: "huge", Topic: topic, Payload: make([]byte, 2<<20)}
	if err := p.Publish(ctx, ok1, huge); err == nil {
		t.Fatal("publishing a record over the batch limit succeeded")
	}
	ok2 := &broker.Message{ID: "ok2", Topic: topic, Payload: []byte("2")}
	ok3 := &broker.Message{ID: "ok3", Topic: topic, Payload: []byte("3")}
	if err := p.Publish(ctx, ok2, ok3); err != nil {
		t.Fatal(err)
	}
	s := newSub(t, fastSub(c, uniq("g"), topic))
	got := fetchN(t, s, 2, 30*time.Second)
	ackAll(t, got)
	for _, m := range got {
		if m.ID == "ok1" || m.ID == "huge" {
			t.Fatalf("message %s of an aborted transaction delivered", m.ID)
		}
	}
	if got[0].ID != "ok2" || got[1].ID != "ok3" {
		t.Fatalf("got %s, %s; want ok2, ok3", got[0].ID, got[1].ID)
	}
}

// TestBackpressure: Fetch hands out at most MaxUnsettled deliveries until
// some settle.
func TestBackpressure(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p := newPub(t, c)
	cfg := fastSub(c, uniq("g"), topic)
	cfg.MaxUnsettled = 5
	s := newSub(t, cfg)
	publish(t, p, msgs(topic, "bp", 20)...)
	got := fetchN(t, s, 5, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if more, err := s.Fetch(ctx, 10); len(more) > 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch past MaxUnsettled: %d messages, err %v", len(more), err)
	}
	ackAll(t, got[:2])
	if more := fetchN(t, s, 2, 30*time.Second); len(more) != 2 {
		t.Fatalf("after 2 acks: %d more", len(more))
	}
}

// TestCommitFailureRetried: a commit the broker refuses (fault injected with
// kfake's ControlKey) is reported, leaves the group's offset alone, and the
// next commit carries the settled prefix.
func TestCommitFailureRetried(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p := newPub(t, c)
	group := uniq("g")
	cfg := fastSub(c, group, topic)
	cfg.CommitInterval = time.Hour
	s := newSub(t, cfg)
	publish(t, p, msgs(topic, "cf", 2)...)
	got := fetchN(t, s, 2, 30*time.Second)
	ackAll(t, got[:1])

	var refused atomic.Int32
	c.ControlKey(kmsg.OffsetCommit.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.OffsetMetadataTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		refused.Add(1)
		return resp, nil, true
	})
	ctx := context.Background()
	if err := s.Commit(ctx); !errors.Is(err, kerr.OffsetMetadataTooLarge) {
		t.Fatalf("refused commit: err = %v", err)
	}
	if refused.Load() != 1 {
		t.Fatalf("control saw %d commits", refused.Load())
	}
	if at := committed(t, adm, group, topic, 0); at != -1 {
		t.Fatalf("after a refused commit the group has offset %d", at)
	}
	ackAll(t, got[1:])
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if at := committed(t, adm, group, topic, 0); at != 2 {
		t.Fatalf("committed %d, want 2", at)
	}
}

// TestLargePayloadConfigured: with the broker's message.max.bytes raised,
// MaxMessageBytes on both sides carries a 4 MiB message; a publish over the
// broker's limit fails and reports it.
func TestLargePayloadConfigured(t *testing.T) {
	c := newCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(5 << 20)}))
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), MaxMessageBytes: 8 << 20, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := fastSub(c, uniq("g"), topic)
	cfg.MaxMessageBytes = 8 << 20
	s := newSub(t, cfg)
	// Random bytes: the producer compresses, and a repetitive payload
	// would shrink below every limit.
	big := make([]byte, 4<<20)
	_, _ = crand.Read(big)
	publish(t, p, &broker.Message{ID: "big", Topic: topic, Payload: big})
	got := fetchN(t, s, 1, 30*time.Second)
	if !bytes.Equal(got[0].Payload, big) {
		t.Fatalf("payload of %d bytes came back as %d bytes", len(big), len(got[0].Payload))
	}
	ackAll(t, got)
	tooBig := make([]byte, 6<<20)
	_, _ = crand.Read(tooBig)
	err = p.Publish(context.Background(), &broker.Message{ID: "too-big", Topic: topic, Payload: tooBig},
		&broker.Message{ID: "small", Topic: topic, Payload: []byte("x")})
	if err == nil {
		t.Fatal("publishing over the broker's message.max.bytes succeeded")
	}
	t.Logf("over the limit: %v", err)
}

// TestCloseUnblocksFetch: Close ends a Fetch blocked on an empty topic with
// broker.ErrClosed.
func TestCloseUnblocksFetch(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	s := newSub(t, fastSub(c, uniq("g"), topic))
	errc := make(chan error, 1)
	go func() {
		_, err := s.Fetch(context.Background(), 10)
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, broker.ErrClosed) {
			t.Fatalf("blocked Fetch after Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not unblock Fetch")
	}
}

// TestPublishUnknownOutcome: with CancelInFlight, a publish whose produce
// requests go unanswered until its context ends reports
// idem.ErrUnknownOutcome (the records may or may not be written).
func TestPublishUnknownOutcome(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), CancelInFlight: true, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	publish(t, p, msgs(topic, "warm", 1)...) // metadata and producer id are known
	// Every produce request from now on goes unanswered.
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, errors.New("dropped"), true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = p.Publish(ctx, msgs(topic, "lost", 1)...)
	if !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("publish with produce requests dropped: %v, want ErrUnknownOutcome", err)
	}
}

// TestNakWaitingAtRevoke: a message waiting out its nak delay when its
// member leaves is not lost: the next owner gets it from the last commit.
func TestNakWaitingAtRevoke(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p := newPub(t, c)
	group := uniq("g")
	publish(t, p, msgs(topic, "w", 3)...)
	a := newSub(t, fastSub(c, group, topic))
	got := fetchN(t, a, 3, 30*time.Second)
	ctx := context.Background()
	if err := got[0].Acker.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := got[1].Acker.Nak(ctx, 8*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := got[2].Acker.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if at := committed(t, adm, group, topic, 0); at != 1 {
		t.Fatalf("committed %d, want 1 (offset 1 waits out its nak)", at)
	}
	b := newSub(t, fastSub(c, group, topic))
	again := fetchN(t, b, 2, 30*time.Second)
	if again[0].ID != got[1].ID || again[1].ID != got[2].ID {
		t.Fatalf("new owner got %s, %s; want %s, %s", again[0].ID, again[1].ID, got[1].ID, got[2].ID)
	}
	ackAll(t, again)
}
