package kafkabroker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
)

// publishWithDuplicates publishes messages from..to-1, 1,000 per Publish,
// and dupFrac of them a second time a batch later through the same
// publisher: Kafka has no broker-side dedup by message id, so every
// duplicate reaches the consumer (in the same partition as its original:
// keyless messages hash by id).
func publishWithDuplicates(t testing.TB, c *kfake.Cluster, topic string, from, to int, dupFrac float64) {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	e2etest.Publish(t, p, p, topic, from, to, dupFrac)
}

// TestEndToEndExactlyOnce drives the consumer runtime (package consumer)
// over this adapter on kfake. It publishes N messages (10,000 by default,
// IDEM_E2E_MESSAGES=100000 for the full run) plus 20% duplicate publishes;
// consumer 1 turns 5% of its acks into naks (effect done, ack lost);
// consumer 2 joins a quarter of the way in (a rebalance moves partitions
// while consumer 1 holds unsettled work); consumer 1 leaves at three
// quarters (another rebalance), all on the adapter's default settings. A
// member killed with SIGKILL is TestEndToEndFaults. The guard
// is on the memory store; each effect appends a row to a PostgreSQL ledger
// with no unique constraint. Every message must be there exactly once and
// the group's commits must reach the end of every partition.
func TestEndToEndExactlyOnce(t *testing.T) {
	// Its own clusters and ledger schemas: it runs beside the other
	// end-to-end test, after the conformance suite (whose per-case leak
	// checks need the process to itself).
	t.Parallel()
	for _, mode := range []e2etest.Mode{e2etest.Single, e2etest.Batch} {
		t.Run(string(mode), func(t *testing.T) { testEndToEnd(t, mode) })
	}
}

func testEndToEnd(t *testing.T, mode e2etest.Mode) {
	n := e2etest.Messages(t, false)
	c := newCluster(t)
	adm := admin(t, c)
	const partitions = 8
	topic := createTopic(t, adm, partitions)
	group := uniq("ledger")
	ledger := e2etest.NewLedger(t, "idem_kafka")
	guard := e2etest.NewGuard(t, e2etest.MemStore(t), idem.WithLease(10*time.Second))

	start := time.Now()
	publishWithDuplicates(t, c, topic, 0, n/2, 0.2)
	t.Logf("published %d messages + ~20%% duplicates in %s", n/2, time.Since(start).Round(time.Millisecond))

	type member struct {
		c     *consumer.Consumer
		sub   *Subscriber
		chaos *e2etest.ChaosSub
		done  chan error
		stop  context.CancelFunc
	}
	start1 := func(nakEvery int64) *member {
		// The adapter's defaults (session timeout 45s...): the members
		// here join and leave politely, so nothing waits on them.
		cfg := SubscriberConfig{Brokers: c.ListenAddrs(), Group: group, Topics: []string{topic}, Logger: quietLog()}
		sub, err := NewSubscriber(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cs := &e2etest.ChaosSub{Subscriber: sub, NakEvery: nakEvery}
		cons, err := consumer.New(ledger.ConsumerConfig(cs, guard, mode))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		m := &member{c: cons, sub: sub, chaos: cs, done: make(chan error, 1), stop: cancel}
		go func() { m.done <- cons.Run(ctx) }()
		return m
	}

	consumeStart := time.Now()
	m1 := start1(20) // 5% of first deliveries: ack turned into nak
	ledger.WaitDistinct(t, "a quarter of the messages", n/4)
	m2 := start1(0) // joins: rebalance while m1 holds unsettled work
	var assigned int
	e2etest.WaitFor(t, "consumer 2 to get partitions", time.Minute, func() (bool, string) {
		m2.sub.mu.Lock()
		assigned = len(m2.sub.parts)
		m2.sub.mu.Unlock()
		return assigned > 0, "none assigned"
	})
	t.Logf("consumer 2 assigned %d partitions at %s", assigned, time.Since(start).Round(time.Millisecond))
	publishWithDuplicates(t, c, topic, n/2, n, 0.2)
	ledger.WaitDistinct(t, "three quarters of the messages", 3*n/4)
	// m1 leaves: it drains what it fetched, commits and leaves the group
	// (a rebalance hands its partitions to m2). A member killed with
	// SIGKILL is TestEndToEndFaults.
	m1.stop()
	if err := <-m1.done; err != nil {
		t.Fatalf("stopped consumer's Run = %v", err)
	}
	if err := m1.sub.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("consumer 1 left at %s", time.Since(start).Round(time.Millisecond))

	ledger.WaitDistinct(t, "every message", n)
	elapsed := time.Since(consumeStart)
	// Drain: the group's commits reach the end of every partition.
	e2etest.WaitFor(t, "the group to drain", 2*time.Minute, func() (bool, string) {
		lag := groupLag(t, adm, group, topic)
		return lag == 0, fmt.Sprintf("lag %d", lag)
	})
	m2.stop()
	if err := <-m2.done; err != nil {
		t.Fatal(err)
	}
	if err := m2.sub.Close(); err != nil {
		t.Fatal(err)
	}

	ledger.AssertExactlyOnce(t, n)
	s1, s2 := m1.c.Stats(), m2.c.Stats()
	forced := m1.chaos.Forced() + m2.chaos.Forced()
	if forced == 0 || s1.Duplicates+s2.Duplicates == 0 || s2.Handled == 0 {
		t.Fatalf("no fault exercised: forced %d, stats %+v %+v", forced, s1, s2)
	}
	t.Logf("%s: %d messages exactly once in %s (%.0f msgs/s); forced naks %d; consumer 1 %+v; consumer 2 %+v",
		mode, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), forced, s1, s2)
}

// groupLag is the sum over partitions of end offset minus committed offset.
func groupLag(t testing.TB, adm *kadm.Client, group, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	var lag int64
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := offs.Lookup(topic, o.Partition); ok && c.At > 0 {
			at = c.At
		}
		lag += o.Offset - at
	})
	return lag
}
