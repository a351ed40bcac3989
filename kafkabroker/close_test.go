package kafkabroker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestCloseDuringStuckRebalance: a second member joins the group and the
// rebalance never completes (the coordinator holds every SyncGroup until
// the test ends), while this member has settled deliveries to commit.
// Close must still return, within CloseTimeout, whatever CommitTimeout
// says: before, its final commit waited for the rebalance (up to
// CommitTimeout), and a worker kept running 15 s and more after SIGTERM.
// What it could not commit is redelivered to the group's next owner.
func TestCloseDuringStuckRebalance(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 2)
	group := uniq("g")
	cfg := fastSub(c, group, topic)
	cfg.CommitInterval = time.Hour // only Close commits
	// Kafka's own session and rebalance timeouts: franz-go waits that
	// long for a SyncGroup answer.
	cfg.SessionTimeout, cfg.RebalanceTimeout, cfg.HeartbeatInterval = DefaultSessionTimeout, DefaultRebalanceTimeout, 300*time.Millisecond
	cfg.CommitTimeout = 5 * time.Minute
	cfg.CloseTimeout = time.Second
	s := newSub(t, cfg)
	ready, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitReady(ready); err != nil {
		t.Fatal(err)
	}
	publish(t, newPub(t, c), msgs(topic, "m", 4)...)
	got := fetchN(t, s, 4, 30*time.Second)

	// Hold every SyncGroup from now on until the test ends.
	release := make(chan struct{})
	var syncs atomic.Int32
	c.ControlKey(int16(kmsg.SyncGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		syncs.Add(1)
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	other, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.HeartbeatInterval(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	t.Cleanup(func() { close(release) }) // runs before other.Close
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		other.PollRecords(ctx, 1) // joins the group
	}()
	for deadline := time.Now().Add(30 * time.Second); syncs.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the rebalance did not reach SyncGroup for both members (%d)", syncs.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	ackAll(t, got) // something to commit at Close

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close during the stuck rebalance: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close still blocked after 30s with CloseTimeout 1s")
	}
}
