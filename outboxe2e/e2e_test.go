package outboxe2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/kafkabroker"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/pgstore"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
	"github.com/idem-dev/idem/snowflake"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// lossyPublisher loses the broker's answer to every every-th publish after
// the broker stored it: the relay sees an error and publishes the batch
// again later, as after a timeout (F6).
type lossyPublisher struct {
	broker.Publisher
	every int64
	n     atomic.Int64
	lost  atomic.Int64
}

func (p *lossyPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := p.Publisher.Publish(ctx, msgs...); err != nil {
		return err
	}
	if p.n.Add(1)%p.every == 0 {
		p.lost.Add(int64(len(msgs)))
		return fmt.Errorf("lossyPublisher: answer lost after the broker stored %d messages", len(msgs))
	}
	return nil
}

// TestEndToEnd: every committed business change has exactly one effect.
//
// Four producers run 2,000 business transactions on PostgreSQL: each
// enqueues a message (its id a snowflake id from a generator that leased
// its worker id from a pgstore table) and inserts an order row holding that
// id; every tenth transaction rolls back after enqueuing. Two relays
// publish the outbox through a publisher that loses one answer in 10 (the
// batch is published again); a guarded consumer, whose records live in a
// time-ordered pgstore table keyed on the snowflake ids
// (snowflake.DefaultLayout.KeyTime), loses one ack in 20 and appends each
// effect to a ledger with no unique constraint. Run once through NATS
// JetStream and once through Kafka (kfake). Verdict: the ledger holds
// exactly one row per committed order, with that order's payload, and
// nothing else.
func TestEndToEnd(t *testing.T) {
	t.Parallel() // its own ledger schemas, stores and streams or topics
	for _, br := range []string{"nats", "kafka"} {
		t.Run(br, func(t *testing.T) { testEndToEnd(t, br) })
	}
}

func testEndToEnd(t *testing.T, brokerName string) {
	const n, producers = 2000, 4
	ctx := ctxT(t)
	ledger := e2etest.NewLedger(t, "oe2e_e2e")
	layout := snowflake.DefaultLayout
	leases := newPGStore(t, ledger, func(c *pgstore.Config) { c.Table = "idem_leases" })
	records := newPGStore(t, ledger, func(c *pgstore.Config) {
		c.Layout, c.KeyTime = pgstore.LayoutTimeOrdered, layout.KeyTime()
	})
	gen, err := snowflake.New(ctx, snowflake.Config{Store: leases, Logger: e2etest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	obCfg := pgoutbox.Config{Pool: ledger.Pool, Schema: ledger.Schema, Table: "outbox", NewID: gen.NextString, Logger: e2etest.Quiet()}
	if err := pgoutbox.Migrate(ctx, obCfg); err != nil {
		t.Fatal(err)
	}
	ob, err := pgoutbox.New(obCfg)
	if err != nil {
		t.Fatal(err)
	}
	orders := pgx.Identifier{ledger.Schema, "orders"}.Sanitize()
	if _, err := ledger.Pool.Exec(ctx, `CREATE TABLE `+orders+` (n int PRIMARY KEY, msg_id text NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}

	var pub broker.Publisher
	var sub broker.Subscriber
	var topic string
	var drained func() (bool, string)
	switch brokerName {
	case "nats":
		_, js := connectJS(t, natsURL())
		stream := newStream(t, js)
		topic = stream + ".orders"
		if pub, err = natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js, Logger: e2etest.Quiet()}); err != nil {
			t.Fatal(err)
		}
		s, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: js, Stream: stream, Durable: "ledger",
			AckWait: 5 * time.Second, MaxDeliver: -1, PollWait: 500 * time.Millisecond, Logger: e2etest.Quiet()})
		if err != nil {
			t.Fatal(err)
		}
		sub = s
		drained = func() (bool, string) { return jsConsumed(js, stream) }
	case "kafka":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatalf("kfake: %v", err)
		}
		t.Cleanup(c.Close)
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		adm := kadm.NewClient(cl)
		topic = uniq("orders")
		if resp, err := adm.CreateTopic(ctx, 4, 1, nil, topic); err != nil || resp.Err != nil {
			t.Fatalf("create topic: %v %v", err, resp.Err)
		}
		p, err := kafkabroker.NewPublisher(kafkabroker.PublisherConfig{Brokers: c.ListenAddrs(), Logger: e2etest.Quiet()})
		if err != nil {
			t.Fatal(err)
		}
		pub = p
		s, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberConfig{Brokers: c.ListenAddrs(), Group: "ledger", Topics: []string{topic},
			CommitInterval: 200 * time.Millisecond, Logger: e2etest.Quiet()})
		if err != nil {
			t.Fatal(err)
		}
		sub = s
		drained = func() (bool, string) { return groupDrained(adm, "ledger", topic) }
	}
	defer pub.Close()
	lossy := &lossyPublisher{Publisher: pub, every: 10}

	// Two relays over one outbox.
	relayCtx, stopRelays := context.WithCancel(context.Background())
	var relays sync.WaitGroup
	for range 2 {
		r, err := outbox.New(outbox.Config{Backend: ob, Publisher: lossy, BatchSize: 50, MaxAttempts: outbox.Unlimited,
			Backoff: outbox.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}, Logger: e2etest.Quiet()})
		if err != nil {
			t.Fatal(err)
		}
		relays.Go(func() { _ = r.Run(relayCtx) })
	}
	defer func() { stopRelays(); relays.Wait() }()

	// The guarded consumer.
	guard := e2etest.NewGuard(t, records, idem.WithLease(10*time.Second))
	chaos := &e2etest.ChaosSub{Subscriber: sub, NakEvery: 20}
	cons, err := consumer.New(ledger.ConsumerConfig(chaos, guard, e2etest.Batch))
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopCons := context.WithCancel(context.Background())
	consDone := make(chan error, 1)
	go func() { consDone <- cons.Run(cctx) }()

	// The business: n transactions, every tenth rolled back.
	start := time.Now()
	var committed atomic.Int64
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := p; i < n; i += producers {
				err := pgx.BeginFunc(ctx, ledger.Pool, func(tx pgx.Tx) error {
					ids, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "order-%d", i), Payload: e2etest.Payload(i)})
					if err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (n, msg_id) VALUES ($1, $2)`, i, ids[0]); err != nil {
						return err
					}
					if i%10 == 3 {
						return errRollback
					}
					return nil
				})
				switch {
				case err == nil:
					committed.Add(1)
				case err != errRollback:
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := int(committed.Load())
	t.Logf("%d business transactions committed, %d rolled back, in %s", want, n-want, time.Since(start).Round(time.Millisecond))
	ledger.WaitDistinct(t, "every committed change applied", want)
	waitDrained(t, ob)
	e2etest.WaitFor(t, "the consumer to settle everything", 2*time.Minute, drained)
	stopCons()
	if err := <-consDone; err != nil {
		t.Fatal(err)
	}
	_ = sub.Close()

	// Verdict.
	var orderRows, ledgerRows, distinct, notOnce, foreign, wrongPayload int
	err = ledger.Pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+orders+`),
	(SELECT count(*) FROM `+ledger.Table+`),
	(SELECT count(DISTINCT msg_id) FROM `+ledger.Table+`),
	(SELECT count(*) FROM `+orders+` o WHERE (SELECT count(*) FROM `+ledger.Table+` l WHERE l.msg_id = o.msg_id) <> 1),
	(SELECT count(*) FROM `+ledger.Table+` l WHERE NOT EXISTS (SELECT 1 FROM `+orders+` o WHERE o.msg_id = l.msg_id)),
	(SELECT count(*) FROM `+ledger.Table+` l JOIN `+orders+` o ON o.msg_id = l.msg_id
		WHERE l.payload IS DISTINCT FROM convert_to('{"n":' || o.n || '}', 'UTF8'))`).
		Scan(&orderRows, &ledgerRows, &distinct, &notOnce, &foreign, &wrongPayload)
	if err != nil {
		t.Fatal(err)
	}
	if orderRows != want || ledgerRows != want || distinct != want || notOnce != 0 || foreign != 0 || wrongPayload != 0 {
		t.Fatalf("not exactly once: %d committed orders (want %d), ledger %d rows / %d ids, %d orders not applied exactly once, %d effects of no committed order, %d with another payload",
			orderRows, want, ledgerRows, distinct, notOnce, foreign, wrongPayload)
	}
	st := cons.Stats()
	if lossy.lost.Load() == 0 || chaos.Forced() == 0 {
		t.Fatalf("no fault exercised: %d publish answers lost, %d acks lost", lossy.lost.Load(), chaos.Forced())
	}
	t.Logf("%s: %d committed changes, exactly one effect each; %d messages' publish answers lost (republished), %d acks lost, consumer %+v",
		brokerName, want, lossy.lost.Load(), chaos.Forced(), st)
}

var errRollback = fmt.Errorf("business rule: roll back")

// groupDrained reports whether the group's commits reach the end of every
// partition of topic.
func groupDrained(adm *kadm.Client, group, topic string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return false, err.Error()
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false, err.Error()
	}
	var lag int64
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := offs.Lookup(topic, o.Partition); ok && c.At > 0 {
			at = c.At
		}
		lag += o.Offset - at
	})
	return lag == 0, fmt.Sprintf("lag %d", lag)
}
