package kafkabroker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/faultstore"
	"github.com/twmb/franz-go/pkg/kadm"
)

// TestEndToEndFaults runs the consumer runtime over this adapter with its
// DEFAULT settings (session timeout 45s, rebalance timeout 60s) on kfake
// through real faults, each asserted to have hit in-flight work:
//
//   - a child process joins the group over TCP, consumes alone (single
//     mode, the guard on pgstore, each effect committed with its claim's
//     completion) and is killed with SIGKILL while it holds claims (read
//     from the store after the kill): no final commit, no LeaveGroup; its
//     partitions move only when its session times out;
//   - the parent (batch mode) joins and meets a store outage of 25s that
//     starts with messages claimed and not yet applied, and refuses claims,
//     completions, extends and releases;
//   - 20% duplicate publishes, flaky handlers and poison messages that must
//     reach the dead-letter topic exactly once.
//
// Every other message must be in the PostgreSQL ledger exactly once, no
// poison message there, no key in progress past its lease, and the group's
// commits must reach the end of every partition.
func TestEndToEndFaults(t *testing.T) {
	if _, _, child := e2etest.ChildParams(); child {
		t.Skip("child process")
	}
	t.Parallel() // its own cluster, ledger schema and child process
	n := e2etest.Messages(t, false)
	if n == 10_000 {
		n = 4000 // the default size of this scenario (8 poison messages)
	}
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 8)
	dlq := createTopic(t, adm, 1)
	group := uniq("ledger")
	ledger := e2etest.NewLedger(t, "idem_kafka_faults")
	pgs := e2etest.OpenPGStore(t, ledger)
	start := time.Now()
	publishWithDuplicates(t, c, topic, 0, n, 0.2)
	t.Logf("published %d messages + ~20%% duplicates (%d poison) in %s", n, e2etest.Poisons(n), time.Since(start).Round(time.Millisecond))

	// 1. The child consumes alone and is killed holding claims.
	child := e2etest.StartChild(t, "TestEndToEndChild", ledger,
		strings.Join([]string{strings.Join(c.ListenAddrs(), ","), topic, group, dlq}, " "))
	e2etest.WaitFor(t, "the child to apply a quarter and hold claims", 3*time.Minute, func() (bool, string) {
		_, distinct := ledger.Counts(t)
		held, _ := ledger.InProgress(t)
		return distinct >= n/4 && held >= 4, fmt.Sprintf("%d applied, %d claims in progress", distinct, held)
	})
	child.Kill(t)
	killedHeld, _ := ledger.InProgress(t)
	_, killedDone := ledger.Counts(t)
	if killedHeld == 0 {
		t.Fatal("the kill hit no in-flight work: no claim in progress after it")
	}
	killedAt := time.Now()
	t.Logf("child killed (SIGKILL) at %s with %d claims in progress and %d effects applied; lag %d", killedAt.Sub(start).Round(time.Millisecond), killedHeld, killedDone, groupLag(t, adm, group, topic))

	// 2. The parent joins on default settings; its partitions come once the
	// dead member's session times out. The store goes down with messages
	// in flight.
	fs := faultstore.New(pgs)
	guard := e2etest.NewGuard(t, fs.WithBatch(), idem.WithLease(time.Minute))
	sub, err := NewSubscriber(SubscriberConfig{Brokers: c.ListenAddrs(), Group: group, Topics: []string{topic}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	gate := &e2etest.Gate{}
	eff := &e2etest.Effects{Ledger: ledger, Gate: gate, Delay: 2 * time.Millisecond}
	cfg := e2etest.FaultConsumerConfig(sub, guard, newPub(t, c), dlq)
	cfg.BatchHandler = eff.BatchHandler()
	cfg.Workers = 4
	cons, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	defer func() {
		stop()
		<-done
		_ = sub.Close()
	}()
	e2etest.WaitFor(t, "the parent to get partitions", 3*time.Minute, func() (bool, string) {
		sub.mu.Lock()
		defer sub.mu.Unlock()
		return len(sub.parts) > 0, "none assigned"
	})
	t.Logf("parent assigned partitions %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	holdsBefore := cons.Stats().Holds
	outage := e2etest.Outage(t, fs, gate, 8, 25*time.Second)
	holds := cons.Stats().Holds - holdsBefore
	t.Logf("store outage: %s; the consumer held %d deliveries meanwhile", outage, holds)
	if holds == 0 {
		t.Fatalf("the consumer held nothing during the outage (stats %+v): the outage never reached it", cons.Stats())
	}

	ledger.WaitDistinct(t, "every message but the poison", n-e2etest.Poisons(n))
	e2etest.WaitFor(t, "the group to drain", 3*time.Minute, func() (bool, string) {
		lag := groupLag(t, adm, group, topic)
		return lag == 0, fmt.Sprintf("lag %d", lag)
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil
	ledger.CheckFaultRun(t, n, readTopic(t, c, adm, dlq))
	poisoned, flakes := eff.Failures()
	if flakes == 0 || poisoned == 0 {
		t.Fatalf("no handler failures in the parent: poison %d, flaky %d", poisoned, flakes)
	}
	t.Logf("%d messages exactly once, %d poison dead-lettered once each, in %s; parent handler failures: poison %d, flaky %d; parent %+v",
		n-e2etest.Poisons(n), e2etest.Poisons(n), time.Since(start).Round(time.Millisecond), poisoned, flakes, cons.Stats())
}

// TestEndToEndChild is TestEndToEndFaults's child process: a group member
// on the parent's kfake, over TCP.
func TestEndToEndChild(t *testing.T) {
	_, params, ok := e2etest.ChildParams()
	if !ok {
		t.Skip("runs only as TestEndToEndFaults's child process")
	}
	f := strings.Fields(params)
	brokers, topic, group, dlq := strings.Split(f[0], ","), f[1], f[2], f[3]
	sub, err := NewSubscriber(SubscriberConfig{Brokers: brokers, Group: group, Topics: []string{topic}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(PublisherConfig{Brokers: brokers, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	e2etest.RunChild(t, e2etest.ChildConfig{Subscriber: sub, DeadLetter: pub, DeadLetterTopic: dlq})
}

// readTopic returns every record of topic, read by a fresh group.
func readTopic(t testing.TB, c interface{ ListenAddrs() []string }, adm *kadm.Client, topic string) []*broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	ends.Each(func(o kadm.ListedOffset) { want += int(o.Offset) })
	sub, err := NewSubscriber(SubscriberConfig{Brokers: c.ListenAddrs(), Group: uniq("check"), Topics: []string{topic}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	return e2etest.ReadN(ctx, t, sub, want)
}
