package kafkabroker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// callbackLog records the partition callbacks a user passes in ClientOpts.
type callbackLog struct {
	mu                      sync.Mutex
	assigned, revoked, lost []int32
}

func (l *callbackLog) record(to *[]int32) func(context.Context, *kgo.Client, map[string][]int32) {
	return func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, ps := range m {
			*to = append(*to, ps...)
		}
	}
}

func (l *callbackLog) get(what *[]int32) []int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int32(nil), *what...)
}

// TestClientOptsPartitionCallbacksChained: OnPartitionsAssigned, Revoked
// and Lost given in ClientOpts all run, and so do the subscriber's own:
// before, the subscriber's options silently replaced the user's. Assigned:
// the user's sees both partitions and the subscriber delivers from them.
// Revoked (a second member takes a partition): the user's sees it, and the
// subscriber committed that partition's settled messages on the way out
// (CommitInterval is an hour, so only a revoke commits). Lost (the
// coordinator forgets the member): the user's sees the partitions, and the
// subscriber dropped its unsettled deliveries.
func TestClientOptsPartitionCallbacksChained(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 2)
	group := uniq("g")
	var log callbackLog
	cfg := fastSub(c, group, topic)
	cfg.CommitInterval = time.Hour
	cfg.ClientOpts = []kgo.Opt{
		kgo.OnPartitionsAssigned(log.record(&log.assigned)),
		kgo.OnPartitionsRevoked(log.record(&log.revoked)),
		kgo.OnPartitionsLost(log.record(&log.lost)),
	}
	s := newSub(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if got := log.get(&log.assigned); len(got) != 2 {
		t.Fatalf("the user's OnPartitionsAssigned saw %v, want both partitions", got)
	}
	pub := newPub(t, c)
	for i := range 8 {
		publish(t, pub, &broker.Message{ID: fmtID(i), Topic: topic, Key: []byte{byte(i)}, Payload: []byte("x")})
	}
	ackAll(t, fetchN(t, s, 8, 30*time.Second))

	// Revoke: a second member joins and takes one partition.
	other, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(100*time.Millisecond), kgo.RebalanceTimeout(3*time.Second),
		kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	go other.PollRecords(ctx, 1)
	waitUntil(t, ctx, "the user's OnPartitionsRevoked", func() bool { return len(log.get(&log.revoked)) > 0 })
	p := log.get(&log.revoked)[0]
	hw := highWatermark(t, adm, topic, p)
	if off := committed(t, adm, group, topic, p); off != hw {
		t.Fatalf("partition %d revoked with offset %d committed, want %d: the subscriber's own revoke did not commit", p, off, hw)
	}

	// Lost: the coordinator answers this member's heartbeat with
	// UNKNOWN_MEMBER_ID, as after its session expired.
	for i := range 8 { // some land on the partition this member kept
		publish(t, pub, &broker.Message{ID: fmtID(10 + i), Topic: topic, Key: []byte{byte(i)}, Payload: []byte("x")})
	}
	held := fetchN(t, s, 1, 30*time.Second)
	s.mu.Lock()
	before := s.unsettled
	s.mu.Unlock()
	member, _ := s.cl.GroupMetadata()
	c.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.(*kmsg.HeartbeatRequest).MemberID != member {
			return nil, nil, false
		}
		c.DropControl()
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	waitUntil(t, ctx, "the user's OnPartitionsLost", func() bool { return len(log.get(&log.lost)) > 0 })
	s.mu.Lock()
	after := s.unsettled
	s.mu.Unlock()
	if before != 1 || after != 0 {
		t.Fatalf("unsettled deliveries %d before the loss, %d after; want 1, 0 (the subscriber's own OnPartitionsLost forgets them)", before, after)
	}
	// Ignored: the partition is gone, and the Ack says so.
	if err := held[0].Acker.Ack(ctx); !errors.Is(err, broker.ErrDeliveryLost) {
		t.Fatalf("Ack of a delivery of a lost partition = %v, want ErrDeliveryLost", err)
	}
}

func fmtID(i int) string { return "m-" + string(rune('a'+i)) }

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// highWatermark is the end offset of topic/partition.
func highWatermark(t *testing.T, adm *kadm.Client, topic string, p int32) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := ends.Lookup(topic, p)
	if !ok || o.Err != nil {
		t.Fatalf("end offset of %s/%d: %v", topic, p, o.Err)
	}
	return o.Offset
}
