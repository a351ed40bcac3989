package natsbroker_test

import (
	"context"
	"errors"
	"flag"
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
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var long = flag.Bool("long", false, "run the end-to-end test with 100,000 messages (default 10,000; IDEM_E2E_MESSAGES overrides both)")

func e2eMessages(t testing.TB) int {
	if s := os.Getenv("IDEM_E2E_MESSAGES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("IDEM_E2E_MESSAGES=%q", s)
		}
		return n
	}
	if *long {
		return 100_000
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
// constraint (so a double effect shows as two rows) and drops it in cleanup.
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
	if err != nil {
		t.Fatalf("postgres at %s: %v", pgURL(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("postgres at %s: %v", pgURL(), err)
	}
	schema := fmt.Sprintf("idem_e2e_%d_%d", time.Now().UnixNano()%1e9, seq.Add(1))
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

// insertOne is the single-message effect: one durable insert.
func insertOne(pool *pgxpool.Pool, table string) consumer.Handler {
	return func(ctx context.Context, m *broker.Message) ([]byte, error) {
		_, err := pool.Exec(ctx, `INSERT INTO `+table+` (msg_id, payload) VALUES ($1, $2)`, m.ID, m.Payload)
		return nil, err
	}
}

// insertBatch is the batch effect: one transaction, COPY of every row;
// all or nothing.
func insertBatch(pool *pgxpool.Pool, table string) consumer.BatchHandler {
	ident := pgx.Identifier(splitTable(table))
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

func splitTable(t string) []string {
	for i := range len(t) {
		if t[i] == '.' {
			return []string{t[:i], t[i+1:]}
		}
	}
	return []string{t}
}

// publishWithDuplicates publishes n messages with Nats-Msg-Id dedup and
// then re-publishes dupFrac of them at random with dedup off, so the
// duplicates really reach the consumer (as after the dedup window).
func publishWithDuplicates(t testing.TB, stream string, n int, dupFrac float64) (ids []string) {
	t.Helper()
	pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	dupPub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js, NoDedup: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	defer dupPub.Close()
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var batch []*broker.Message
	var dups []*broker.Message
	flush := func(p *natsbroker.Publisher, ms []*broker.Message) {
		if len(ms) == 0 {
			return
		}
		if err := p.Publish(ctx, ms...); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	for i := range n {
		id := fmt.Sprintf("msg-%07d", i)
		ids = append(ids, id)
		m := &broker.Message{ID: id, Topic: stream, Payload: fmt.Appendf(nil, `{"n":%d}`, i),
			Headers: map[string]string{broker.HeaderTraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
		batch = append(batch, m)
		if rng.Float64() < dupFrac {
			dups = append(dups, m)
		}
		if len(batch) == 1000 {
			flush(pub, batch)
			batch = batch[:0]
			// Duplicates go out interleaved with later originals.
			flush(dupPub, dups)
			dups = dups[:0]
		}
	}
	flush(pub, batch)
	flush(dupPub, dups)
	return ids
}

// chaosSub injects faults into a subscriber: every nakEvery-th first
// delivery has its Ack turned into Nak(0) (effect done, ack lost: F1/F4),
// and Crash makes it behave like a dead process: acks are silently
// dropped and Fetch fails.
type chaosSub struct {
	broker.Subscriber
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

// Crash: from now on nothing this subscriber settles reaches the broker.
func (s *chaosSub) Crash() { s.crashed.Store(true) }

type chaosAcker struct {
	broker.Acker
	s          *chaosSub
	nakInstead bool
}

func (a *chaosAcker) Ack(ctx context.Context) error {
	if a.s.crashed.Load() {
		return nil // lost with the process
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

// TestEndToEndExactlyOnce: publish N messages (10,000; 100,000 with -long)
// plus 20% duplicate publishes that bypass the broker's dedup, force
// redeliveries (lost acks), crash the first consumer a quarter of the way
// in, leave 50 claims orphaned by a "dead worker" (F2) and take the store
// down (claims refused) as the second one takes over; consume with the
// guard on the memory store and on pgstore (records durable in the same
// PostgreSQL), each effect a row appended to a PostgreSQL ledger with no
// unique constraint. Every message must be in the ledger exactly once.
func TestEndToEndExactlyOnce(t *testing.T) {
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
	n := e2eMessages(t)
	if backend == "pgstore" && mode == "single" {
		// Three autocommitted statements per message (claim, insert,
		// complete): a fifth of N keeps the default run short.
		n = max(n/5, 1)
	}
	stream := newStream(t, nil)
	pool, table := newLedger(t)
	var base idem.Store
	var pgs *pgstore.Store
	if backend == "pgstore" {
		// Records durable in PostgreSQL, in the ledger's schema.
		pgs = newPGStore(t, pool, splitTable(table)[0])
		base = pgs
	} else {
		mem, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		base = mem
	}
	store := &outageStore{Store: base}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	guard, err := idem.NewGuard(store, idem.WithLease(10*time.Second), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer guard.Close()

	start := time.Now()
	ids := publishWithDuplicates(t, stream, n, 0.2)
	t.Logf("published %d messages + duplicates in %s", n, time.Since(start))

	var forced atomic.Int64
	newConsumer := func(nakEvery int64) (*consumer.Consumer, *chaosSub, *natsbroker.Subscriber) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{
			JS: js, Stream: stream, Durable: "ledger",
			AckWait: 3 * time.Second, MaxDeliver: -1, MaxAckPending: 20000, PollWait: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		cs := &chaosSub{Subscriber: sub, nakEvery: nakEvery, forced: &forced}
		cfg := consumer.Config{
			Subscriber:         cs,
			Guard:              guard,
			Workers:            16,
			MaxInFlight:        4000,
			FetchBatch:         500,
			InProgressInterval: time.Second,
			StoreDownDelay:     time.Second,
			Logger:             quiet,
		}
		switch mode {
		case "batch":
			cfg.Workers = 4
			cfg.BatchHandler = insertBatch(pool, table)
			cfg.Batch = consumer.BatchConfig{Size: 500, Wait: 10 * time.Millisecond}
		case "tx":
			cfg.Workers = 4
			cfg.TxBatchHandler = insertBatchTx(pool, pgs, table, store)
			cfg.Batch = consumer.BatchConfig{Size: 500, Wait: 10 * time.Millisecond}
		default:
			cfg.Handler = insertOne(pool, table)
		}
		c, err := consumer.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c, cs, sub
	}
	rows := func() (total, distinct int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM `+table).Scan(&total, &distinct); err != nil {
			t.Fatal(err)
		}
		return total, distinct
	}
	waitRows := func(what string, ok func(total, distinct int) bool) {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			total, distinct := rows()
			if ok(total, distinct) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %d rows, %d distinct", what, total, distinct)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	consumeStart := time.Now()
	c1, chaos1, sub1 := newConsumer(20) // 5% lost acks
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- c1.Run(ctx1) }()
	waitRows("a quarter of the messages", func(_, d int) bool { return d >= n/4 })
	// Crash: everything c1 holds unacked is redelivered after AckWait.
	chaos1.Crash()
	if err := <-done1; !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("crashed consumer's Run = %v", err)
	}
	cancel1()
	sub1.Close()

	// F2: a worker that died after claiming, before its effect: claims on
	// up to 50 messages not yet in the ledger, never settled and not kept
	// alive. Consumer 2 must nak them while the lease lives, then take
	// them over.
	orphans := orphanClaims(t, store, pool, table, n, 50)
	store.down.Store(true)
	c2, _, sub2 := newConsumer(0)
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- c2.Run(ctx2) }()
	// The store goes down as consumer 2 takes over (claims fail: F10),
	// for at least a second and until some claim was refused (consumer
	// 1's unacked messages come back after AckWait); the consumer must
	// fail closed (nak with delay, no effect, no ack) and recover.
	outageEnd := time.Now().Add(15 * time.Second)
	time.Sleep(time.Second)
	for store.failed.Load() == 0 && time.Now().Before(outageEnd) {
		time.Sleep(10 * time.Millisecond)
	}
	store.down.Store(false)
	waitRows("every message", func(_, d int) bool { return d == n })
	elapsed := time.Since(consumeStart)
	// Let the stream drain: nothing pending or unacked.
	cons, err := js.Consumer(context.Background(), stream, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream not drained: %d pending, %d unacked", info.NumPending, info.NumAckPending)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cancel2()
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	sub2.Close()

	total, distinct := rows()
	if distinct != n || total != n {
		var dupID string
		var cnt int
		_ = pool.QueryRow(context.Background(), `SELECT msg_id, count(*) FROM `+table+` GROUP BY msg_id HAVING count(*) > 1 LIMIT 1`).Scan(&dupID, &cnt)
		t.Fatalf("ledger has %d rows for %d distinct ids, want %d each once (e.g. %s x%d)", total, distinct, n, dupID, cnt)
	}
	// Spot-check ids.
	var missing int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM unnest($1::text[]) id WHERE NOT EXISTS (SELECT 1 FROM `+table+` l WHERE l.msg_id = id)`, ids).Scan(&missing); err != nil {
		t.Fatal(err)
	}
	if missing != 0 {
		t.Fatalf("%d published ids missing from the ledger", missing)
	}
	s1, s2 := c1.Stats(), c2.Stats()
	if forced.Load() == 0 || s1.Duplicates+s2.Duplicates == 0 || store.failed.Load() == 0 {
		t.Fatalf("no fault exercised: forced %d, stats %+v %+v", forced.Load(), s1, s2)
	}
	t.Logf("%s/%s: %d messages exactly once in %s; forced redeliveries %d; claims refused during the outage %d; orphaned claims taken over %d; consumer 1 %+v; consumer 2 %+v",
		backend, mode, n, elapsed.Round(time.Millisecond), forced.Load(), store.failed.Load(), orphans, s1, s2)
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
func orphanClaims(t *testing.T, store idem.Store, pool *pgxpool.Pool, table string, n, max int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT i FROM generate_series(0, $1::int - 1) i
		WHERE NOT EXISTS (SELECT 1 FROM `+table+` l WHERE l.msg_id = 'msg-' || lpad(i::text, 7, '0')) LIMIT $2`, n, max)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	dead, err := idem.NewGuard(store, idem.WithLease(2*time.Second), idem.WithHeartbeat(-1),
		idem.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	claimed := 0
	for _, i := range idx {
		fp := consumer.PayloadFingerprint(&broker.Message{Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		h, _, err := dead.Acquire(ctx, fmt.Appendf(nil, "msg-%07d", i), idem.WithFingerprint(fp))
		if err == nil && h != nil {
			claimed++ // and dropped on the floor
		}
	}
	return claimed
}

// insertBatchTx is the transactional batch effect (invariant 2): claims,
// COPY of the acquired rows and completions in one transaction. While
// outage is down the database counts as unreachable.
func insertBatchTx(pool *pgxpool.Pool, st *pgstore.Store, table string, outage *outageStore) consumer.TxBatchHandler {
	ident := pgx.Identifier(splitTable(table))
	return func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		if outage != nil && outage.down.Load() {
			outage.failed.Add(1)
			return nil, fmt.Errorf("%w: injected outage", idem.ErrUnavailable)
		}
		out := make([]consumer.TxOutcome, len(items))
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			reqs := make([]idem.ClaimRequest, len(items))
			for i, it := range items {
				reqs[i] = idem.ClaimRequest{Key: it.Key, Fingerprint: it.Fingerprint, Lease: 30 * time.Second, TTL: 24 * time.Hour}
			}
			res, err := st.ClaimBatchTx(ctx, tx, reqs)
			if err != nil {
				return err
			}
			var rows [][]any
			var acquired []int
			for i, r := range res {
				switch {
				case errors.Is(r.Err, idem.ErrFingerprintMismatch):
					out[i] = consumer.TxOutcome{Status: consumer.TxRejected, Err: r.Err}
				case r.Err != nil:
					out[i] = consumer.TxOutcome{Status: consumer.TxRetry, Err: r.Err}
				case r.Claim.Outcome == idem.OutcomeCompleted:
					out[i] = consumer.TxOutcome{Status: consumer.TxDuplicate}
				case r.Claim.Outcome == idem.OutcomeInProgress:
					out[i] = consumer.TxOutcome{Status: consumer.TxInProgress, RetryAfter: time.Until(r.Claim.Record.LeaseUntil)}
				case r.Claim.Outcome == idem.OutcomeFailed:
					out[i] = consumer.TxOutcome{Status: consumer.TxRejected, Err: errors.New(r.Claim.Record.LastError)}
				default:
					rows = append(rows, []any{items[i].Msg.ID, items[i].Msg.Payload})
					acquired = append(acquired, i)
					out[i] = consumer.TxOutcome{Status: consumer.TxDone}
				}
			}
			if len(rows) > 0 {
				if _, err := tx.CopyFrom(ctx, ident, []string{"msg_id", "payload"}, pgx.CopyFromRows(rows)); err != nil {
					return err
				}
			}
			for _, i := range acquired {
				if err := st.CompleteTx(ctx, tx, items[i].Key, res[i].Claim.Record.Token, nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return out, nil
	}
}

// newPGStore is a pgstore in schema (dropped with the ledger's schema).
func newPGStore(t testing.TB, pool *pgxpool.Pool, schema string) *pgstore.Store {
	t.Helper()
	cfg := pgstore.Config{Pool: pool, Schema: schema, Table: "idem_records",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgstore.Migrate(ctx, cfg); err != nil {
		t.Fatalf("pgstore migrate: %v", err)
	}
	s, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
