package natsbroker_test

import (
	"context"
	"flag"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

var long = flag.Bool("long", false, "run the end-to-end test with 100,000 messages (default 10,000; IDEM_E2E_MESSAGES overrides both)")

// publishWithDuplicates publishes messages 0..n-1 with Nats-Msg-Id dedup
// and re-publishes dupFrac of them at random with dedup off, so the
// duplicates really reach the consumer (as after the dedup window).
func publishWithDuplicates(t testing.TB, stream string, n int, dupFrac float64) {
	t.Helper()
	pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	dupPub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js, NoDedup: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dupPub.Close()
	e2etest.Publish(t, pub, dupPub, stream, 0, n, dupFrac)
}

// TestEndToEndExactlyOnce: publish N messages (10,000; 100,000 with -long)
// plus 20% duplicate publishes that bypass the broker's dedup, force
// redeliveries (lost acks), crash the first consumer a quarter of the way
// in, leave 50 claims orphaned by a "dead worker" (F2) and take the store
// down (claims refused) as the second one takes over; consume with the
// guard on the memory store and on pgstore (records durable in the same
// PostgreSQL), each effect a row appended to a PostgreSQL ledger with no
// unique constraint. Every message must be in the ledger exactly once.
func TestEndToEndExactlyOnce(t *testing.T) {
	// Its own streams, ledger schemas and stores: it runs beside the
	// other end-to-end tests (its runs one after another: each ledger's
	// pool takes up to 16 of the shared PostgreSQL's 100 connections).
	t.Parallel()
	for _, backend := range []string{"memstore", "pgstore"} {
		modes := []string{"single", "batch"}
		if backend == "pgstore" {
			modes = append(modes, "tx") // records and effects in one transaction
		}
		for _, mode := range modes {
			t.Run(backend+"/"+mode, func(t *testing.T) { testEndToEnd(t, backend, mode) })
		}
	}
}

func testEndToEnd(t *testing.T, backend, mode string) {
	n := e2etest.Messages(t, *long)
	if backend == "pgstore" && mode == "single" {
		// Three autocommitted statements per message (claim, insert,
		// complete): a fifth of N keeps the default run short.
		n = max(n/5, 1)
	}
	stream := newStream(t, nil)
	ledger := e2etest.NewLedger(t, "idem_e2e")
	var base idem.Store
	var pgs *pgstore.Store
	if backend == "pgstore" {
		// Records durable in PostgreSQL, in the ledger's schema.
		pgs = e2etest.OpenPGStore(t, ledger)
		base = pgs
	} else {
		base = e2etest.MemStore(t)
	}
	store := &outageStore{Store: base}
	guard := e2etest.NewGuard(t, store, idem.WithLease(10*time.Second))

	start := time.Now()
	publishWithDuplicates(t, stream, n, 0.2)
	t.Logf("published %d messages + duplicates in %s", n, time.Since(start))

	newConsumer := func(nakEvery int64) (*consumer.Consumer, *e2etest.ChaosSub, *natsbroker.Subscriber) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{
			JS: js, Stream: stream, Durable: "ledger", // the adapter's defaults: AckWait 30s, MaxDeliver 20
		})
		if err != nil {
			t.Fatal(err)
		}
		cs := &e2etest.ChaosSub{Subscriber: sub, NakEvery: nakEvery}
		var cfg consumer.Config
		switch mode {
		case "batch":
			cfg = ledger.ConsumerConfig(cs, guard, e2etest.Batch)
		case "tx":
			cfg = ledger.ConsumerConfig(cs, guard, e2etest.Batch)
			cfg.BatchHandler, cfg.TxBatchHandler = nil, insertBatchTx(t, ledger, pgs, store)
		default:
			cfg = ledger.ConsumerConfig(cs, guard, e2etest.Single)
		}
		c, err := consumer.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c, cs, sub
	}

	consumeStart := time.Now()
	c1, chaos1, sub1 := newConsumer(20) // 5% lost acks
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- c1.Run(ctx1) }()
	ledger.WaitDistinct(t, "a quarter of the messages", n/4)
	// Handover: consumer 1 stops (drains what it fetched) and consumer 2
	// takes over. A real crash (SIGKILL of a process holding claims) is
	// TestEndToEndFaults.
	cancel1()
	if err := <-done1; err != nil {
		t.Fatalf("stopped consumer's Run = %v", err)
	}
	sub1.Close()

	// F2: a worker that died after claiming, before its effect: claims on
	// up to 50 messages not yet in the ledger, never settled and not kept
	// alive. Consumer 2 must nak them while the lease lives, then take
	// them over.
	orphans := orphanClaims(t, store, ledger, n, 50)
	store.down.Store(true)
	c2, chaos2, sub2 := newConsumer(0)
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- c2.Run(ctx2) }()
	// The store goes down as consumer 2 takes over (claims fail: F10),
	// for at least a second and until some claim was refused; the
	// consumer must fail closed (no effect, no ack) and recover. The long
	// outage over claims, completions, extends and releases is
	// TestEndToEndFaults.
	outageEnd := time.Now().Add(15 * time.Second)
	time.Sleep(time.Second)
	for store.failed.Load() == 0 && time.Now().Before(outageEnd) {
		time.Sleep(10 * time.Millisecond)
	}
	store.down.Store(false)
	ledger.WaitDistinct(t, "every message", n)
	elapsed := time.Since(consumeStart)
	waitDrained(t, stream, 2*time.Minute)
	cancel2()
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	sub2.Close()

	ledger.AssertExactlyOnce(t, n)
	s1, s2 := c1.Stats(), c2.Stats()
	forced := chaos1.Forced() + chaos2.Forced()
	if forced == 0 || s1.Duplicates+s2.Duplicates == 0 || store.failed.Load() == 0 {
		t.Fatalf("no fault exercised: forced %d, stats %+v %+v", forced, s1, s2)
	}
	t.Logf("%s/%s: %d messages exactly once in %s; forced redeliveries %d; claims refused during the outage %d; orphaned claims taken over %d; consumer 1 %+v; consumer 2 %+v",
		backend, mode, n, elapsed.Round(time.Millisecond), forced, store.failed.Load(), orphans, s1, s2)
}

// outageStore refuses claims with idem.ErrUnavailable while down is set.
// Only claims: an outage between effect and completion is the dual-write
// case (ErrUnrecorded), which a ledger outside the store cannot survive
// and the guard documents.
type outageStore struct {
	idem.Store
	down   atomic.Bool
	failed atomic.Int64
}

func (s *outageStore) Claim(ctx context.Context, r idem.ClaimRequest) (idem.Claim, error) {
	if s.down.Load() {
		s.failed.Add(1)
		return idem.Claim{}, fmt.Errorf("%w: injected outage", idem.ErrUnavailable)
	}
	return s.Store.Claim(ctx, r)
}

func (s *outageStore) ClaimBatch(ctx context.Context, rs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	if s.down.Load() {
		s.failed.Add(1)
		return nil, fmt.Errorf("%w: injected outage", idem.ErrUnavailable)
	}
	return s.Store.(idem.BatchClaimer).ClaimBatch(ctx, rs)
}

// orphanClaims claims up to max keys of messages not yet in the ledger
// through a guard without heartbeat, and never settles them: what a
// worker that died between claim and effect leaves behind.
func orphanClaims(t *testing.T, store idem.Store, ledger *e2etest.Ledger, n, max int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, err := idem.NewGuard(store, idem.WithLease(2*time.Second), idem.WithHeartbeat(-1), idem.WithLogger(e2etest.Quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	claimed := 0
	for _, i := range ledger.Missing(t, n, max) {
		fp := consumer.PayloadFingerprint(&broker.Message{Payload: e2etest.Payload(i)})
		h, _, err := dead.Acquire(ctx, []byte(e2etest.ID(i)), idem.WithFingerprint(fp))
		if err == nil && h != nil {
			claimed++ // and dropped on the floor
		}
	}
	return claimed
}

// insertBatchTx is the transactional batch effect (invariant 2): claims,
// COPY of the acquired rows and completions in one transaction
// (pgstore.TxBatchHandler). While outage is down the database counts as
// unreachable.
func insertBatchTx(t testing.TB, ledger *e2etest.Ledger, st *pgstore.Store, outage *outageStore) consumer.TxBatchHandler {
	h, err := pgstore.TxBatchHandler(st, pgstore.TxHandlerConfig{TTL: 24 * time.Hour}, func(ctx context.Context, tx pgx.Tx, msgs []*broker.Message) ([][]byte, error) {
		return nil, ledger.Copy(ctx, tx, msgs)
	})
	if err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		if outage != nil && outage.down.Load() {
			outage.failed.Add(1)
			return nil, fmt.Errorf("%w: injected outage", idem.ErrUnavailable)
		}
		return h(ctx, items)
	}
}
