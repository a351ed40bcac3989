package rabbitbroker_test

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
	"github.com/idem-dev/idem/rabbitbroker"
)

// TestEndToEndFaults runs the consumer runtime over this adapter with its
// DEFAULT settings (quorum queue, x-delivery-limit 20, dead-letter
// exchange, TermDeadLetter, prefetch 1024) through real faults, each
// asserted to have hit in-flight work:
//
//   - a child process consumes alone (single mode, the guard on pgstore,
//     each effect committed with its claim's completion) and is killed with
//     SIGKILL while it holds claims (read from the store after the kill):
//     nothing it held is settled; the broker requeues its unacked
//     deliveries when it sees the socket close (each return counts one
//     delivery);
//   - the parent takes over and meets a store outage (10s; 25s with
//     IDEM_RABBIT_LONG) that starts with messages claimed and not yet
//     applied, and refuses claims, completions, extends and releases;
//   - 20% duplicate publishes, flaky handlers (fail once, then succeed) and
//     poison messages (always fail; half permanent) that the consumer
//     dead-letters to a poison queue exactly once each.
//
// Every other message must be in the PostgreSQL ledger exactly once, no
// poison message there, no key in progress past its lease, nothing left in
// the work queue, and the broker's own dead-letter queue (what Term and
// the delivery limit sent there) must hold poison messages only: no good
// message was dropped at the delivery limit.
func TestEndToEndFaults(t *testing.T) {
	if _, _, child := e2etest.ChildParams(); child {
		t.Skip("child process")
	}
	t.Parallel() // its own exchange, queues, ledger schema and child process
	n := messages(t, 1000, 4000)
	outageFor, lease := 10*time.Second, 20*time.Second
	if longRuns() {
		outageFor, lease = 25*time.Second, time.Minute
	}
	x := newTopo(t)
	cfg := x.subConfig(t, "ledger")
	poison := x.subConfig(t, "poison")
	poison.Topics = []string{x.Topic + ".poison"}
	for _, c := range []rabbitbroker.SubscriberConfig{cfg, poison} {
		if err := rabbitbroker.Declare(ctxT(t, 30*time.Second), c); err != nil {
			t.Fatal(err)
		}
	}
	ledger := e2etest.NewLedger(t, "idem_rabbit_faults")
	pgs := e2etest.OpenPGStore(t, ledger)
	start := time.Now()
	publishWithDuplicates(t, x, n, 0.2)
	t.Logf("published %d messages + ~20%% duplicates (%d poison) in %s", n, e2etest.Poisons(n), time.Since(start).Round(time.Millisecond))

	// 1. The child consumes alone and is killed holding claims.
	child := e2etest.StartChild(t, "TestEndToEndChild", ledger, strings.Join([]string{x.Exchange, cfg.Queue, x.Topic, poison.Topics[0]}, " "))
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
	t.Logf("child killed (SIGKILL) at %s with %d claims in progress and %d effects applied", time.Since(start).Round(time.Millisecond), killedHeld, killedDone)

	// 2. The parent takes over on default settings; the store goes down
	// with messages in flight.
	fs := faultstore.New(pgs)
	// The effect is outside the store: the lease must outlast the outage,
	// or a completion refused during it could be overtaken.
	guard := e2etest.NewGuard(t, fs.WithBatch(), idem.WithLease(lease))
	sub := subscriber(t, cfg)
	gate := &e2etest.Gate{}
	eff := &e2etest.Effects{Ledger: ledger, Gate: gate, Delay: 2 * time.Millisecond}
	ccfg := e2etest.FaultConsumerConfig(sub, guard, x.publisher(t), poison.Topics[0])
	ccfg.Handler = eff.Handler()
	c, err := consumer.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	holdsBefore := c.Stats().Holds
	outage := e2etest.Outage(t, fs, gate, 8, outageFor)
	holds := c.Stats().Holds - holdsBefore
	t.Logf("store outage: %s; the consumer held %d deliveries meanwhile", outage, holds)
	if holds == 0 || outage.Claims() == 0 {
		// Order keys are message keys here (the messages have no Key):
		// the workers the held deliveries freed must have claimed others
		// and been refused. A consumer the outage never reached fails.
		t.Fatalf("the outage never reached the consumer: %d deliveries held, %d claims refused (stats %+v)", holds, outage.Claims(), c.Stats())
	}

	ledger.WaitDistinct(t, "every message but the poison", n-e2etest.Poisons(n))
	// Drained: every poison message dead-lettered, nothing ready, waiting
	// in a delay queue or held.
	e2etest.WaitFor(t, "the queues to drain", 3*time.Minute, func() (bool, string) {
		r, u := queueCounts(t, cfg.Queue)
		p, h, delayed := queueDepth(t, poison.Queue), c.Stats().HeldNow, delayedCount(t, cfg)
		return r+u+delayed == 0 && h == 0 && p >= e2etest.Poisons(n),
			fmt.Sprintf("%d ready, %d unacked, %d in delay queues, %d held, %d dead-lettered", r, u, delayed, h, p)
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if d := queueDepth(t, cfg.Queue); d != 0 {
		t.Fatalf("%d messages back in the queue after the consumer closed: left unacked", d)
	}
	ledger.CheckFaultRun(t, n, readQueue(t, poison))
	// The broker's dead-letter queue: the originals the runtime
	// terminated after dead-lettering them (TermDeadLetter), and anything
	// the delivery limit dropped. Poison only.
	dead := drainQueue(t, cfg.Queue+".dlq")
	for _, id := range dead {
		if i, ok := e2etest.Index(id); !ok || !e2etest.Poison(i) {
			t.Errorf("broker dead-letter queue holds %s, not a poison message", id)
		}
	}
	poisoned, flakes := eff.Failures()
	if flakes == 0 || poisoned == 0 {
		t.Fatalf("no handler failures in the parent: poison %d, flaky %d", poisoned, flakes)
	}
	t.Logf("%d messages exactly once, %d poison dead-lettered once each (broker dead-letter queue: %d terminated originals), in %s; parent handler failures: poison %d, flaky %d; parent %+v",
		n-e2etest.Poisons(n), e2etest.Poisons(n), len(dead), time.Since(start).Round(time.Millisecond), poisoned, flakes, c.Stats())
}

// TestEndToEndChild is TestEndToEndFaults's child process.
func TestEndToEndChild(t *testing.T) {
	_, params, ok := e2etest.ChildParams()
	if !ok {
		t.Skip("runs only as TestEndToEndFaults's child process")
	}
	f := strings.Fields(params)
	exchange, queue, topic, dlq := f[0], f[1], f[2], f[3]
	conn := rabbitbroker.Conn{URL: rabbitbroker.RabbitURL(), Logger: quiet()}
	sub, err := rabbitbroker.NewSubscriber(rabbitbroker.SubscriberConfig{Conn: conn, Exchange: exchange, Queue: queue, Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := rabbitbroker.NewPublisher(rabbitbroker.PublisherConfig{Conn: conn, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	// A 5s lease: the parent waits that long for the keys the killed
	// child held (the guard's default, 30s, would only make the run
	// longer; IDEM_RABBIT_LONG keeps it).
	lease := 5 * time.Second
	if longRuns() {
		lease = 0
	}
	e2etest.RunChild(t, e2etest.ChildConfig{Subscriber: sub, DeadLetter: pub, DeadLetterTopic: dlq, Lease: lease})
}

// readQueue reads every message in cfg's queue (its depth when called).
func readQueue(t testing.TB, cfg rabbitbroker.SubscriberConfig) []*broker.Message {
	t.Helper()
	want := queueDepth(t, cfg.Queue)
	if want == 0 {
		return nil
	}
	cfg.Name = unique(t, "idemtest-read")
	sub, err := rabbitbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return e2etest.ReadN(ctx, t, sub, want)
}

// drainQueue takes every message of q with basic.get and returns their ids.
func drainQueue(t testing.TB, q string) []string {
	t.Helper()
	ch := adminChannel(t)
	defer ch.Close()
	var ids []string
	for {
		d, ok, err := ch.Get(q, false)
		if err != nil {
			t.Fatalf("basic.get %s: %v", q, err)
		}
		if !ok {
			return ids
		}
		ids = append(ids, d.MessageId)
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
}

// delayedCount is the number of messages in cfg's delay queues.
func delayedCount(t testing.TB, cfg rabbitbroker.SubscriberConfig) int {
	t.Helper()
	n := 0
	for _, b := range rabbitbroker.DefaultDelayBuckets {
		ch := adminChannel(t)
		// A delay queue not declared yet is a 404, which closes ch.
		if q, err := ch.QueueDeclarePassive(cfg.DelayQueue(b), true, false, false, false, nil); err == nil {
			n += q.Messages
		}
		ch.Close()
	}
	return n
}
