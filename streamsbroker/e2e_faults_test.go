package streamsbroker_test

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
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
)

// TestEndToEndFaults runs the consumer runtime over this adapter with its
// DEFAULT settings (AckWait 30s, MaxDeliver 20, ClaimInterval 1s) through
// real faults, each asserted to have hit in-flight work:
//
//   - a child process consumes alone (single mode, the guard on pgstore,
//     each effect committed with its claim's completion) and is killed with
//     SIGKILL while it holds claims (read from the store after the kill):
//     nothing it held is settled or handed back; its entries stay pending
//     under its consumer name until the ack wait lets the parent reclaim
//     them;
//   - the parent takes over and meets a store outage of 25s (longer than
//     MaxDeliver x the 1s store-down delay) that starts with messages
//     claimed and not yet applied, and refuses claims, completions,
//     extends and releases;
//   - 20% duplicate publishes, flaky handlers (fail once, then succeed) and
//     poison messages (always fail; half permanent) that must reach the
//     dead-letter stream exactly once.
//
// Every other message must be in the PostgreSQL ledger (no unique
// constraint) exactly once, no poison message there, no key in progress
// past its lease, and no entry moved to the adapter's own dead-letter
// stream (holding through the outage spent no delivery).
func TestEndToEndFaults(t *testing.T) {
	if _, _, child := e2etest.ChildParams(); child {
		t.Skip("child process")
	}
	t.Parallel()
	c := sharedClient(t)
	n := messages(t, 2000, 4000)
	stream := newStream(t, c)
	dlq := newStream(t, c)
	ledger := e2etest.NewLedger(t, "idem_streams_faults")
	pgs := e2etest.OpenPGStore(t, ledger)
	start := time.Now()
	publishWithDuplicates(t, c, stream, n, 0.2)
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
	childPending := pending(t, c, stream, "ledger")
	t.Logf("child killed (SIGKILL) at %s with %d claims in progress, %d effects applied, %d entries pending", time.Since(start).Round(time.Millisecond), killedHeld, killedDone, childPending)

	// 2. The parent takes over on default settings; the store goes down
	// with messages in flight.
	fs := faultstore.New(pgs)
	// The effect is outside the store: the lease must outlast the outage,
	// or a completion refused during it could be overtaken (docs/consumer.md).
	guard := e2etest.NewGuard(t, fs.WithBatch(), idem.WithLease(time.Minute))
	sub, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: c, Stream: stream, Group: "ledger", Logger: e2etest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	gate := &e2etest.Gate{}
	eff := &e2etest.Effects{Ledger: ledger, Gate: gate, Delay: 2 * time.Millisecond}
	cfg := e2etest.FaultConsumerConfig(sub, guard, deadLetterPublisher(t, c), dlq)
	cfg.Handler = eff.Handler()
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
	}()
	holdsBefore := cons.Stats().Holds
	outage := e2etest.Outage(t, fs, gate, 8, 25*time.Second)
	holds := cons.Stats().Holds - holdsBefore
	t.Logf("store outage: %s; the consumer held %d deliveries meanwhile", outage, holds)
	if holds == 0 || outage.Claims() == 0 {
		// Order keys are message keys here (the messages have no Key):
		// the workers the held deliveries freed must have claimed others
		// and been refused. A consumer the outage never reached fails.
		t.Fatalf("the outage never reached the consumer: %d deliveries held, %d claims refused (stats %+v)", holds, outage.Claims(), cons.Stats())
	}

	ledger.WaitDistinct(t, "every message but the poison", n-e2etest.Poisons(n))
	waitDrained(t, c, stream, "ledger", 3*time.Minute)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil
	ledger.CheckFaultRun(t, n, readAll(t, c, dlq))
	poisoned, flakes := eff.Failures()
	if flakes == 0 || poisoned == 0 {
		t.Fatalf("no handler failures in the parent: poison %d, flaky %d", poisoned, flakes)
	}
	st := sub.Stats()
	if st.Redelivered < childPending {
		t.Fatalf("the parent reclaimed %d entries, the child left %d pending", st.Redelivered, childPending)
	}
	if st.DeadLettered != 0 || xlen(t, c, streamsbroker.DeadLetterStream(stream)) != 0 {
		t.Fatalf("%d entries reached the delivery limit", st.DeadLettered)
	}
	t.Logf("%d messages exactly once, %d poison dead-lettered once each, in %s; parent handler failures: poison %d, flaky %d; parent %+v; subscriber %+v",
		n-e2etest.Poisons(n), e2etest.Poisons(n), time.Since(start).Round(time.Millisecond), poisoned, flakes, cons.Stats(), st)
}

// TestEndToEndChild is TestEndToEndFaults's child process.
func TestEndToEndChild(t *testing.T) {
	_, params, ok := e2etest.ChildParams()
	if !ok {
		t.Skip("runs only as TestEndToEndFaults's child process")
	}
	stream, dlq, _ := strings.Cut(params, " ")
	c := sharedClient(t)
	sub, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: c, Stream: stream, Group: "ledger", Logger: e2etest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	e2etest.RunChild(t, e2etest.ChildConfig{Subscriber: sub, DeadLetter: deadLetterPublisher(t, c), DeadLetterTopic: dlq})
}

// deadLetterPublisher publishes without dedup, so a message dead-lettered
// twice shows up twice.
func deadLetterPublisher(t testing.TB, c redis.UniversalClient) broker.Publisher {
	return newPub(t, c, func(cfg *streamsbroker.PublisherConfig) { cfg.NoDedup = true })
}

// readAll returns every entry of stream (through a group of its own).
func readAll(t testing.TB, c redis.UniversalClient, stream string) []*broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want := int(xlen(t, c, stream))
	sub := newSub(t, c, stream, "check", nil)
	return e2etest.ReadN(ctx, t, sub, want)
}
