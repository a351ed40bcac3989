package natsbroker_test

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
	"github.com/idem-dev/idem/natsbroker"
)

// faultMessages is the fault scenario's size: 4,000 by default (8 of them
// poison), IDEM_E2E_MESSAGES overrides it.
func faultMessages(t testing.TB) int {
	if *long {
		return e2etest.Messages(t, true)
	}
	n := e2etest.Messages(t, false)
	if n == 10_000 { // the default, not an override
		n = 4000
	}
	return n
}

// TestEndToEndFaults runs the consumer runtime over this adapter with its
// DEFAULT settings (AckWait 30s, MaxDeliver 20) through real faults, each
// asserted to have hit in-flight work:
//
//   - a child process consumes alone (single mode, the guard on pgstore,
//     each effect committed with its claim's completion) and is killed with
//     SIGKILL while it holds claims (read from the store after the kill):
//     nothing it held is settled, no goodbye to the server;
//   - the parent takes over and meets a store outage of 25s (longer than
//     MaxDeliver x the 1s store-down delay) that starts with messages
//     claimed and not yet applied, and refuses claims, completions,
//     extends and releases;
//   - 20% duplicate publishes, flaky handlers (fail once, then succeed) and
//     poison messages (always fail; half permanent) that must reach the
//     dead-letter stream exactly once.
//
// Every other message must be in the PostgreSQL ledger (no unique
// constraint) exactly once, no poison message there, and no key in
// progress past its lease.
func TestEndToEndFaults(t *testing.T) {
	if _, _, child := e2etest.ChildParams(); child {
		t.Skip("child process")
	}
	t.Parallel() // its own streams, ledger schema and child process
	n := faultMessages(t)
	stream := newStream(t, nil)
	dlq := newStream(t, nil)
	ledger := e2etest.NewLedger(t, "idem_nats_faults")
	pgs := e2etest.OpenPGStore(t, ledger)
	start := time.Now()
	publishWithDuplicates(t, stream, n, 0.2)
	t.Logf("published %d messages + ~20%% duplicates (%d poison) in %s", n, e2etest.Poisons(n), time.Since(start).Round(time.Millisecond))

	// 1. The child consumes alone and is killed holding claims.
	child := e2etest.StartChild(t, "TestEndToEndChild", ledger, stream+" "+dlq)
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
	// or a completion refused during it could be overtaken (docs/consumer.md).
	guard := e2etest.NewGuard(t, fs.WithBatch(), idem.WithLease(time.Minute))
	gate := &e2etest.Gate{}
	eff := &e2etest.Effects{Ledger: ledger, Gate: gate, Delay: 2 * time.Millisecond}
	cfg := e2etest.FaultConsumerConfig(faultSubscriber(t, stream), guard, deadLetterPublisher(t), dlq)
	cfg.Handler = eff.Handler()
	c, stop := e2etest.RunConsumer(t, cfg)
	faultOutage(t, fs, gate, c, 25*time.Second)

	ledger.WaitDistinct(t, "every message but the poison", n-e2etest.Poisons(n))
	waitDrained(t, stream, 3*time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ledger.CheckFaultRun(t, n, readAll(t, dlq))
	poisoned, flakes := eff.Failures()
	if flakes == 0 || poisoned == 0 {
		t.Fatalf("no handler failures in the parent: poison %d, flaky %d", poisoned, flakes)
	}
	t.Logf("%d messages exactly once, %d poison dead-lettered once each, in %s; parent handler failures: poison %d, flaky %d; parent %+v",
		n-e2etest.Poisons(n), e2etest.Poisons(n), time.Since(start).Round(time.Millisecond), poisoned, flakes, c.Stats())
}

// TestEndToEndChild is TestEndToEndFaults's child process.
func TestEndToEndChild(t *testing.T) {
	_, params, ok := e2etest.ChildParams()
	if !ok {
		t.Skip("runs only as TestEndToEndFaults's child process")
	}
	stream, dlq, _ := strings.Cut(params, " ")
	e2etest.RunChild(t, e2etest.ChildConfig{Subscriber: faultSubscriber(t, stream), DeadLetter: deadLetterPublisher(t), DeadLetterTopic: dlq})
}

// faultSubscriber is the fault scenarios' subscriber to stream: the
// durable "ledger" with the adapter's defaults, closed at cleanup.
func faultSubscriber(t testing.TB, stream string) broker.Subscriber {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: js, Stream: stream, Durable: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub
}

// faultOutage is e2etest.Outage for d, 8 messages held at the gate at its
// start, and fails the test unless the consumer c held deliveries and
// claims were refused meanwhile: order keys are message keys here, so the
// workers the held deliveries freed must have claimed others.
func faultOutage(t testing.TB, fs *faultstore.Store, gate *e2etest.Gate, c *consumer.Consumer, d time.Duration) e2etest.OutageReport {
	t.Helper()
	holdsBefore := c.Stats().Holds
	outage := e2etest.Outage(t, fs, gate, 8, d)
	holds := c.Stats().Holds - holdsBefore
	t.Logf("store outage: %s; the consumer held %d deliveries meanwhile, %d completions unrecorded", outage, holds, c.Stats().Unrecorded)
	if holds == 0 || outage.Claims() == 0 {
		t.Fatalf("the outage never reached the consumer: %d deliveries held, %d claims refused (stats %+v)", holds, outage.Claims(), c.Stats())
	}
	return outage
}

// waitDrained waits up to timeout until stream's durable "ledger" has
// nothing pending or unacked.
func waitDrained(t testing.TB, stream string, timeout time.Duration) {
	t.Helper()
	cons, err := js.Consumer(context.Background(), stream, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	e2etest.WaitFor(t, "the stream to drain", timeout, func() (bool, string) {
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.NumPending == 0 && info.NumAckPending == 0, fmt.Sprintf("%d pending, %d unacked, %d redelivered", info.NumPending, info.NumAckPending, info.NumRedelivered)
	})
}

// deadLetterPublisher publishes without Nats-Msg-Id, so the server's
// duplicate window does not hide a message dead-lettered twice.
func deadLetterPublisher(t testing.TB) broker.Publisher {
	p, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js, NoDedup: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// readAll returns every message of stream.
func readAll(t testing.TB, stream string) []*broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := int(info.State.Msgs)
	sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: js, Stream: stream, Durable: "check"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	return e2etest.ReadN(ctx, t, sub, want)
}
