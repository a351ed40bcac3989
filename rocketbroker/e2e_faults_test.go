package rocketbroker_test

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
	"github.com/idem-dev/idem/rocketbroker"
	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
)

// TestEndToEndFaults runs the consumer runtime over this adapter with its
// DEFAULT settings (concurrent push consumer, MaxReconsumeTimes 3 so
// MaxDeliveries 4, TermDeadLetter, MaxInFlight 1024, ConsumeTimeout 15m)
// through real faults, each asserted to have hit in-flight work:
//
//   - a child process consumes alone (single mode, the guard on pgstore,
//     each effect committed with its claim's completion) and is killed with
//     SIGKILL while it holds claims (read from the store after the kill):
//     nothing it held is settled; its TCP connections close with it, the
//     broker drops it from the group, and its queues are consumed again
//     from its last committed offsets (the client commits every 5s and on
//     pulls), so the parent redelivers what it had applied since;
//   - the parent takes over and meets a store outage (10s; 25s with
//     IDEM_ROCKET_LONG) that starts with messages claimed and not yet
//     applied, and refuses claims, completions, extends and releases: the
//     runtime holds them (their consume callbacks stay blocked, InProgress
//     keeps the client's consume timeout off them);
//   - 20% duplicate publishes, flaky handlers (fail once, then succeed) and
//     poison messages (always fail; half permanent) that the consumer
//     dead-letters to a poison topic exactly once each, on their last
//     delivery at the latest (it never naks a fourth delivery).
//
// Every other message must be in the PostgreSQL ledger exactly once, no
// poison message there, no key in progress past its lease, the group
// drained, and (on the fake) the broker's own %DLQ%<group> must hold poison
// messages only (the originals Term sent there after the runtime
// dead-lettered them): no good message was dropped at the delivery limit.
func TestEndToEndFaults(t *testing.T) {
	if _, _, child := e2etest.ChildParams(); child {
		t.Skip("child process")
	}
	t.Parallel()
	n := messages(t, 1000, 4000)
	outageFor, lease := 10*time.Second, 20*time.Second
	if longRuns() {
		outageFor, lease = 25*time.Second, time.Minute
	}
	x := newTopic(t, 4)
	cfg := x.subConfig(t, "ledger")
	poison := newTopic(t, 1)
	ledger := e2etest.NewLedger(t, "idem_rocket_faults")
	pgs := e2etest.OpenPGStore(t, ledger)
	start := time.Now()
	publishWithDuplicates(t, x, n, 0.2)
	t.Logf("published %d messages + ~20%% duplicates (%d poison) in %s", n, e2etest.Poisons(n), time.Since(start).Round(time.Millisecond))

	// 1. The child consumes alone and is killed holding claims.
	child := e2etest.StartChild(t, "TestEndToEndChild", ledger, strings.Join([]string{x.c.namesrv, x.Name, cfg.Group, poison.Name}, " "))
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
	ccfg := e2etest.FaultConsumerConfig(sub, guard, x.publisher(t), poison.Name)
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
	outage := e2etest.Outage(t, fs, gate, 8, outageFor)
	t.Logf("store outage: %s", outage)

	ledger.WaitDistinct(t, "every message but the poison", n-e2etest.Poisons(n))
	poisonCfg := rocketbroker.SubscriberConfig{Client: x.c.client(), Group: poison.Name + "_reader", Topics: []string{poison.Name}}
	x.c.dropGroup(t, poisonCfg.Group)
	// Drained: every poison message dead-lettered, nothing uncommitted,
	// waiting out a delay level or held.
	drained(t, x, cfg, 3*time.Minute, func() (bool, string) {
		dl, err := rocketbroker.GroupLag(ctxT(t, 10*time.Second), poisonCfg.Client, poisonCfg.Group, poison.Name)
		if err != nil {
			return false, err.Error()
		}
		h := c.Stats().HeldNow
		return h == 0 && dl >= int64(e2etest.Poisons(n)), fmt.Sprintf("%d held, %d dead-lettered", h, dl)
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	ledger.CheckFaultRun(t, n, readTopic(t, poisonCfg))
	poisoned, flakes := eff.Failures()
	if flakes == 0 || poisoned == 0 {
		t.Fatalf("no handler failures in the parent: poison %d, flaky %d", poisoned, flakes)
	}
	dlq := -1
	if x.c.fake != nil {
		// The broker's dead-letter topic: originals the runtime terminated
		// after dead-lettering them (TermDeadLetter), and anything a nak on
		// a last delivery would have sent. Poison only.
		msgs := x.c.fake.Messages(remoting.DLQTopic(cfg.Group))
		dlq = len(msgs)
		for _, m := range msgs {
			if i, ok := e2etest.Index(m.Properties[broker.HeaderMessageID]); !ok || !e2etest.Poison(i) {
				t.Errorf("%%DLQ%% holds %s, not a poison message", m.Properties[broker.HeaderMessageID])
			}
		}
	}
	t.Logf("%d messages exactly once, %d poison dead-lettered once each (broker %%DLQ%%: %d terminated originals), in %s; parent handler failures: poison %d, flaky %d; parent %+v",
		n-e2etest.Poisons(n), e2etest.Poisons(n), dlq, time.Since(start).Round(time.Millisecond), poisoned, flakes, c.Stats())
}

// TestEndToEndChild is TestEndToEndFaults's child process.
func TestEndToEndChild(t *testing.T) {
	_, params, ok := e2etest.ChildParams()
	if !ok {
		t.Skip("runs only as TestEndToEndFaults's child process")
	}
	f := strings.Fields(params)
	namesrv, topicName, group, dlq := f[0], f[1], f[2], f[3]
	cl := rocketbroker.Client{NameServers: []string{namesrv}, Logger: quiet()}
	sub, err := rocketbroker.NewSubscriber(rocketbroker.SubscriberConfig{Client: cl, Group: group, Topics: []string{topicName}})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := rocketbroker.NewPublisher(rocketbroker.PublisherConfig{Client: cl})
	if err != nil {
		t.Fatal(err)
	}
	// A 5s lease: the parent waits that long for the keys the killed
	// child held (the guard's default, 30s, would only make the run
	// longer; IDEM_ROCKET_LONG keeps it).
	lease := 5 * time.Second
	if longRuns() {
		lease = 0
	}
	e2etest.RunChild(t, e2etest.ChildConfig{Subscriber: sub, DeadLetter: pub, DeadLetterTopic: dlq, Lease: lease})
}

// readTopic reads every message of cfg's topic with a new group (as many
// as its lag when called).
func readTopic(t testing.TB, cfg rocketbroker.SubscriberConfig) []*broker.Message {
	t.Helper()
	want, err := rocketbroker.GroupLag(ctxT(t, 10*time.Second), cfg.Client, cfg.Group, cfg.Topics...)
	if err != nil {
		t.Fatal(err)
	}
	if want == 0 {
		return nil
	}
	sub := subscriber(t, cfg)
	defer sub.Close()
	return e2etest.ReadN(ctxT(t, time.Minute), t, sub, int(want))
}
