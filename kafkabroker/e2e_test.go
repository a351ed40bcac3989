package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
)

// e2eMessages: 10,000 by default; IDEM_E2E_MESSAGES=100000 for the full run.
func e2eMessages(t testing.TB) int {
	if s := os.Getenv("IDEM_E2E_MESSAGES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("IDEM_E2E_MESSAGES=%q", s)
		}
		return n
	}
	return 10_000
}

func pgURL() string {
	if u := os.Getenv("IDEM_PG_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// newLedger makes a unique schema with a ledger table that has NO unique
// constraint, so a double effect shows as two rows; it is dropped at cleanup.
func newLedger(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(pgURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("postgres at %s: %v", pgURL(), err)
	}
	schema := fmt.Sprintf("idem_kafka_%d_%d", time.Now().UnixNano()%1e9, seq.Add(1))
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.ledger (msg_id text NOT NULL, payload bytea, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		pool.Close()
	})
	return pool, schema + ".ledger"
}

func insertOne(pool *pgxpool.Pool, table string) consumer.Handler {
	return func(ctx context.Context, m *broker.Message) ([]byte, error) {
		_, err := pool.Exec(ctx, `INSERT INTO `+table+` (msg_id, payload) VALUES ($1, $2)`, m.ID, m.Payload)
		return nil, err
	}
}

// insertBatch: one transaction, COPY of every row, synchronous commit.
func insertBatch(pool *pgxpool.Pool, table string) consumer.BatchHandler {
	schema, name, _ := cut(table, '.')
	ident := pgx.Identifier{schema, name}
	return func(ctx context.Context, msgs []*broker.Message) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		rows := make([][]any, len(msgs))
		for i, m := range msgs {
			rows[i] = []any{m.ID, m.Payload}
		}
		if _, err := tx.CopyFrom(ctx, ident, []string{"msg_id", "payload"}, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

func cut(s string, sep byte) (string, string, bool) {
	for i := range len(s) {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// publishWithDuplicates publishes n messages, 1,000 per Publish, and
// publishes dupFrac of them a second time a batch later: Kafka has no
// broker-side dedup by message id, so every duplicate reaches the consumer
// (in the same partition as its original: keyless messages hash by id).
func publishWithDuplicates(t testing.TB, c *kfake.Cluster, topic string, from, to int, dupFrac float64) {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{Brokers: c.ListenAddrs(), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rng := rand.New(rand.NewPCG(uint64(from), uint64(to)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var batch, dups []*broker.Message
	flush := func(ms []*broker.Message) {
		if len(ms) > 0 {
			if err := p.Publish(ctx, ms...); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	for i := from; i < to; i++ {
		m := &broker.Message{ID: fmt.Sprintf("msg-%07d", i), Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, i),
			Headers: map[string]string{broker.HeaderTraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
		batch = append(batch, m)
		if rng.Float64() < dupFrac {
			dups = append(dups, m)
		}
		if len(batch) == 1000 {
			flush(batch)
			batch = batch[:0]
			flush(dups)
			dups = dups[:0]
		}
	}
	flush(batch)
	flush(dups)
}

// chaosSub injects faults: every nakEvery-th first delivery has its Ack
// turned into Nak(0) (the effect is done but the ack is lost: F1/F4), and
// after Crash nothing settles and Fetch fails, like a dead process.
type chaosSub struct {
	*Subscriber
	nakEvery int64
	n        atomic.Int64
	crashed  atomic.Bool
	forced   *atomic.Int64
}

func (s *chaosSub) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if s.crashed.Load() {
		return nil, broker.ErrClosed
	}
	msgs, err := s.Subscriber.Fetch(ctx, max)
	for _, m := range msgs {
		a := &chaosAcker{Acker: m.Acker, s: s}
		if m.Delivery == 1 && s.nakEvery > 0 && s.n.Add(1)%s.nakEvery == 0 {
			a.nakInstead = true
		}
		m.Acker = a
	}
	return msgs, err
}

type chaosAcker struct {
	broker.Acker
	s          *chaosSub
	nakInstead bool
}

func (a *chaosAcker) Ack(ctx context.Context) error {
	if a.s.crashed.Load() {
		return nil
	}
	if a.nakInstead {
		a.s.forced.Add(1)
		return a.Acker.Nak(ctx, 0)
	}
	return a.Acker.Ack(ctx)
}

func (a *chaosAcker) Nak(ctx context.Context, d time.Duration) error {
	if a.s.crashed.Load() {
		return nil
	}
	return a.Acker.Nak(ctx, d)
}

func (a *chaosAcker) Term(ctx context.Context, reason string) error {
	if a.s.crashed.Load() {
		return nil
	}
	return a.Acker.Term(ctx, reason)
}

// TestEndToEndExactlyOnce drives the consumer runtime (package consumer)
// over this adapter on kfake. It publishes N messages (10,000 by default,
// IDEM_E2E_MESSAGES=100000 for the full run) plus 20% duplicate publishes;
// consumer 1 turns 5% of its acks into naks (effect done, ack lost);
// consumer 2 joins a quarter of the way in (a rebalance moves partitions
// while consumer 1 holds unsettled work); consumer 1 is killed halfway
// (no final commit: every ack since its last commit is lost too). The guard
// is on the memory store; each effect appends a row to a PostgreSQL ledger
// with no unique constraint. Every message must be there exactly once and
// the group's commits must reach the end of every partition.
func TestEndToEndExactlyOnce(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) { testEndToEnd(t, mode) })
	}
}

func testEndToEnd(t *testing.T, mode string) {
	n := e2eMessages(t)
	c := newCluster(t)
	adm := admin(t, c)
	const partitions = 8
	topic := createTopic(t, adm, partitions)
	group := uniq("ledger")
	pool, table := newLedger(t)
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	guard, err := idem.NewGuard(store, idem.WithLease(10*time.Second), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer guard.Close()

	start := time.Now()
	publishWithDuplicates(t, c, topic, 0, n/2, 0.2)
	t.Logf("published %d messages + ~20%% duplicates in %s", n/2, time.Since(start).Round(time.Millisecond))

	var forced atomic.Int64
	type member struct {
		c     *consumer.Consumer
		chaos *chaosSub
		done  chan error
		stop  context.CancelFunc
	}
	start1 := func(nakEvery int64) *member {
		cfg := fastSub(c, group, topic)
		cfg.SessionTimeout = 3 * time.Second
		cfg.HeartbeatInterval = 300 * time.Millisecond
		cfg.RebalanceTimeout = 10 * time.Second
		cfg.CommitInterval = 200 * time.Millisecond
		cfg.MaxUnsettled = 8000
		cfg.RevokeDrain = time.Second
		sub, err := NewSubscriber(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cs := &chaosSub{Subscriber: sub, nakEvery: nakEvery, forced: &forced}
		ccfg := consumer.Config{
			Subscriber:         cs,
			Guard:              guard,
			Workers:            16,
			MaxInFlight:        4000,
			FetchBatch:         500,
			InProgressInterval: time.Second,
			StoreDownDelay:     time.Second,
			Logger:             quiet,
		}
		if mode == "batch" {
			ccfg.Workers = 4
			ccfg.BatchHandler = insertBatch(pool, table)
			ccfg.Batch = consumer.BatchConfig{Size: 500, Wait: 10 * time.Millisecond}
		} else {
			ccfg.Handler = insertOne(pool, table)
		}
		cons, err := consumer.New(ccfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		m := &member{c: cons, chaos: cs, done: make(chan error, 1), stop: cancel}
		go func() { m.done <- cons.Run(ctx) }()
		return m
	}
	rows := func() (total, distinct int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM `+table).Scan(&total, &distinct); err != nil {
			t.Fatal(err)
		}
		return total, distinct
	}
	waitRows := func(what string, want int) {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			total, distinct := rows()
			if distinct >= want {
				t.Logf("%s: %d rows, %d distinct at %s", what, total, distinct, time.Since(start).Round(time.Millisecond))
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %d rows, %d distinct", what, total, distinct)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	consumeStart := time.Now()
	m1 := start1(20) // 5% of first deliveries: ack turned into nak
	waitRows("a quarter of the messages", n/4)
	m2 := start1(0) // joins: rebalance while m1 holds unsettled work
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		m2.chaos.mu.Lock()
		assigned := len(m2.chaos.parts)
		m2.chaos.mu.Unlock()
		if assigned > 0 {
			t.Logf("consumer 2 assigned %d partitions at %s", assigned, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("consumer 2 never got partitions")
		}
	}
	publishWithDuplicates(t, c, topic, n/2, n, 0.2)
	waitRows("three quarters of the messages", 3*n/4)
	// Kill m1: nothing more settles (what its workers finish is lost with
	// it), no final commit.
	m1.chaos.crashed.Store(true)
	m1.stop()
	if err := <-m1.done; err != nil && !errors.Is(err, broker.ErrClosed) && !errors.Is(err, context.Canceled) {
		t.Fatalf("killed consumer's Run = %v", err)
	}
	m1.chaos.abandon()
	t.Logf("consumer 1 killed at %s", time.Since(start).Round(time.Millisecond))

	waitRows("every message", n)
	elapsed := time.Since(consumeStart)
	// Drain: the group's commits reach the end of every partition.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		lag := groupLag(t, adm, group, topic)
		if lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group not drained: lag %d", lag)
		}
		time.Sleep(100 * time.Millisecond)
	}
	m2.stop()
	if err := <-m2.done; err != nil {
		t.Fatal(err)
	}
	if err := m2.chaos.Close(); err != nil {
		t.Fatal(err)
	}

	total, distinct := rows()
	if distinct != n || total != n {
		var dupID string
		var cnt int
		_ = pool.QueryRow(context.Background(), `SELECT msg_id, count(*) FROM `+table+` GROUP BY msg_id HAVING count(*) > 1 LIMIT 1`).Scan(&dupID, &cnt)
		t.Fatalf("ledger has %d rows for %d distinct ids, want %d each once (e.g. %s x%d)", total, distinct, n, dupID, cnt)
	}
	var wrong int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE msg_id <> 'msg-' || lpad((convert_from(payload, 'UTF8')::json->>'n'), 7, '0')`).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Fatalf("%d ledger rows carry another message's payload", wrong)
	}
	s1, s2 := m1.c.Stats(), m2.c.Stats()
	if forced.Load() == 0 || s1.Duplicates+s2.Duplicates == 0 || s2.Handled == 0 {
		t.Fatalf("no fault exercised: forced %d, stats %+v %+v", forced.Load(), s1, s2)
	}
	t.Logf("%s: %d messages exactly once in %s (%.0f msgs/s); forced naks %d; consumer 1 %+v; consumer 2 %+v",
		mode, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), forced.Load(), s1, s2)
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
