package kafkabroker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var seq atomic.Int64

func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
}

// quietLog keeps franz-go's expected warnings (rebalances, closed
// connections) out of test output unless -v is given.
func quietLog() *slog.Logger {
	lvl := slog.LevelError
	if testing.Verbose() {
		lvl = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// newCluster starts an in-process Kafka (kfake) closed at cleanup. Group
// session timeouts down to 100ms are allowed so tests see rebalances fast.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// admin returns a kadm client on c, closed at cleanup.
func admin(t testing.TB, c *kfake.Cluster) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// createTopic makes a unique topic with n partitions, deleted at cleanup.
func createTopic(t testing.TB, adm *kadm.Client, n int32) string {
	t.Helper()
	topic := uniq("topic")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, n, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})
	return topic
}

// fastSub is a subscriber config with timings for tests: a dead member is
// noticed in ~3s and revoke drains briefly. The tests' members leave the
// group by Close, which needs no session to expire; a 1s session made kfake
// expel live members whose heartbeats (every 100ms) a loaded machine held
// back for a second, and a member that rejoins is handed its partitions
// from the last commit, so messages acked since came back (conformance
// PublishConsume: "acked message(s) delivered again", at load ~35).
func fastSub(c *kfake.Cluster, group string, topics ...string) SubscriberConfig {
	return SubscriberConfig{
		Brokers:           c.ListenAddrs(),
		Group:             group,
		Topics:            topics,
		SessionTimeout:    3 * time.Second,
		RebalanceTimeout:  3 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		CommitInterval:    100 * time.Millisecond,
		RevokeDrain:       200 * time.Millisecond,
		MaxNakDelay:       10 * time.Second,
		MaxMessageBytes:   2 << 20,
		Logger:            quietLog(),
	}
}

func newPub(t testing.TB, c *kfake.Cluster) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), MaxMessageBytes: 2 << 20, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newSub(t testing.TB, cfg SubscriberConfig) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func msgs(topic, prefix string, n int) []*broker.Message {
	out := make([]*broker.Message, n)
	for i := range out {
		out[i] = &broker.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Topic: topic, Payload: fmt.Appendf(nil, "p-%d", i)}
	}
	return out
}

func publish(t testing.TB, p broker.Publisher, ms ...*broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Publish(ctx, ms...); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// fetchN fetches until n deliveries arrived or timeout; it fails the test on
// a timeout.
func fetchN(t testing.TB, s broker.Subscriber, n int, timeout time.Duration) []*broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*broker.Message
	for len(got) < n {
		ms, err := s.Fetch(ctx, n-len(got))
		if err != nil {
			t.Fatalf("fetch: got %d of %d: %v", len(got), n, err)
		}
		got = append(got, ms...)
	}
	return got
}

func ackAll(t testing.TB, ms []*broker.Message) {
	t.Helper()
	for _, m := range ms {
		if err := m.Acker.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// committed returns the group's committed offset of topic/partition (-1 if
// none).
func committed(t testing.TB, adm *kadm.Client, group, topic string, partition int32) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	os, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	o, ok := os.Lookup(topic, partition)
	if !ok {
		return -1
	}
	if o.Err != nil {
		t.Fatalf("fetch offsets: %v", o.Err)
	}
	return o.At
}
