// Package txtest tests a SQL store's consumer integration (pgstore,
// mysqlstore): its TxHandler and TxBatchHandler adapters, and DoTx called
// inside a plain consumer handler, on membroker with a ledger table in the
// store's database.
package txtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
)

// Env is a store under test whose transactions are of type T, on a fresh
// database or schema with an empty ledger (no unique constraint: a double
// effect is two rows).
type Env[T any] struct {
	Store          idem.Store
	TxHandler      func(fn func(ctx context.Context, tx T, m *broker.Message) ([]byte, error)) (consumer.TxHandler, error)
	TxBatchHandler func(fn func(ctx context.Context, tx T, msgs []*broker.Message) ([][]byte, error)) (consumer.TxBatchHandler, error)
	// DoTx is the store's DoTx: claim req, fn, complete, in one
	// transaction.
	DoTx func(ctx context.Context, req idem.ClaimRequest, fn func(ctx context.Context, tx T) ([]byte, error)) (idem.Claim, error)
	// Insert adds a ledger row for id in tx; Count counts id's rows.
	Insert func(ctx context.Context, tx T, id string) error
	Count  func(t *testing.T, id string) int
	// Unavailable is an error of the store's driver that only the store's
	// ClassifyError (not idem.ClassifyError) maps onto idem.ErrUnavailable.
	Unavailable error
}

// Run runs every test, each on an Env from newEnv.
func Run[T any](t *testing.T, newEnv func(t *testing.T) Env[T]) {
	t.Run("TxHandler", func(t *testing.T) { testTxHandler(t, newEnv(t)) })
	t.Run("TxBatchHandler", func(t *testing.T) { testTxBatchHandler(t, newEnv(t)) })
	for _, mode := range []string{"single", "batch"} {
		t.Run("ClassifiesDatabaseErrors/"+mode, func(t *testing.T) { testClassifies(t, newEnv(t), mode) })
		t.Run("DoTxInsideHandler/"+mode, func(t *testing.T) { testDoTxInsideHandler(t, newEnv(t), mode) })
	}
}

// run is a consumer on membroker topic "orders" whose guard reports lost
// leases.
type run[T any] struct {
	Env[T]
	t     *testing.T
	b     *membroker.Broker
	guard *idem.Guard
	lost  atomic.Int64
}

func newRun[T any](t *testing.T, e Env[T], guardOnMemstore bool) *run[T] {
	t.Helper()
	r := &run[T]{Env: e, t: t}
	b, err := membroker.New(membroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r.b = b
	gs := e.Store
	if guardOnMemstore {
		ms, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		gs = ms
	}
	hooks := idem.Hooks{OnLeaseLost: func(context.Context, []byte, uint64, error) { r.lost.Add(1) }}
	g, err := idem.NewGuard(gs, idem.WithLease(2*time.Second), idem.WithHooks(hooks), idem.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	r.guard = g
	return r
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// config is a consumer configuration with fast retries.
func (r *run[T]) config() consumer.Config {
	return consumer.Config{
		Subscriber:     r.b.NewSubscriber("orders", "g"),
		Guard:          r.guard,
		DeadLetter:     r.b.NewPublisher(),
		Workers:        4,
		MaxAttempts:    3,
		Backoff:        consumer.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2},
		StoreDownDelay: 50 * time.Millisecond,
		Batch:          consumer.BatchConfig{Size: 50, Wait: 10 * time.Millisecond},
		Logger:         quiet(),
	}
}

func (r *run[T]) publish(ids ...string) {
	r.t.Helper()
	for _, id := range ids {
		m := &broker.Message{ID: id, Topic: "orders", Payload: []byte("order " + id)}
		if err := r.b.NewPublisher().Publish(context.Background(), m); err != nil {
			r.t.Fatal(err)
		}
	}
}

// start runs a consumer with cfg and returns a function that stops it
// and waits.
func (r *run[T]) start(cfg consumer.Config) (c *consumer.Consumer, stop func()) {
	r.t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				r.t.Errorf("Run = %v", err)
			}
		})
	}
	r.t.Cleanup(stop)
	return c, stop
}

func (r *run[T]) record(id string) idem.Record {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, _ := r.Store.Get(ctx, []byte(id))
	return rec
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// testTxHandler: the single-message transactional mode through the
// store's TxHandler. Every effect commits with its record once, whatever
// the duplicates; an error rolls back and is retried; an idem.Permanent
// error dead-letters the message once and marks its key failed.
func testTxHandler[T any](t *testing.T, e Env[T]) {
	r := newRun(t, e, false)
	var flaky atomic.Int32
	h, err := e.TxHandler(func(ctx context.Context, tx T, m *broker.Message) ([]byte, error) {
		if err := e.Insert(ctx, tx, m.ID); err != nil {
			return nil, err
		}
		switch m.ID {
		case "poison":
			return nil, idem.Permanent(errors.New("order rejected"))
		case "flaky":
			if flaky.Add(1) == 1 {
				return nil, errors.New("try again") // after the insert: rolled back
			}
		}
		return []byte("ok " + m.ID), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.config()
	cfg.TxHandler = h
	good := append(ids("order", 40), "flaky")
	r.publish(good...)
	r.publish("poison")
	r.publish(good[:10]...) // duplicate publishes
	c, stop := r.start(cfg)
	waitUntil(t, "every delivery settled", func() bool {
		s := c.Stats()
		return s.Handled+s.Duplicates == int64(len(good)+10) && s.DeadLettered == 1
	})
	stop()
	for _, id := range good {
		if n, rec := e.Count(t, id), r.record(id); n != 1 || rec.State != idem.StateCompleted || string(rec.Result) != "ok "+id {
			t.Errorf("%s: ledger %d, record %+v; want one effect, completed with its result", id, n, rec)
		}
	}
	if n, st := e.Count(t, "poison"), r.record("poison").State; n != 0 || st != idem.StateFailed {
		t.Errorf("poison: ledger %d, state %s; want 0, failed", n, st)
	}
	if dl := r.b.Published("orders.dead-letter"); len(dl) != 1 {
		t.Errorf("%d dead letters, want 1", len(dl))
	}
	if flaky.Load() != 2 {
		t.Errorf("flaky ran %d times, want 2", flaky.Load())
	}
}

// testTxBatchHandler: the transactional batch mode through the store's
// TxBatchHandler: duplicates in and across batches, a whole batch that
// fails once (rolled back, run again), and a PartialError whose failed
// messages are released (retried) or failed for good (dead-lettered) in
// the same transaction that commits the others.
func testTxBatchHandler[T any](t *testing.T, e Env[T]) {
	r := newRun(t, e, false)
	var calls, retried atomic.Int32
	h, err := e.TxBatchHandler(func(ctx context.Context, tx T, msgs []*broker.Message) ([][]byte, error) {
		failed := map[int]error{}
		results := make([][]byte, len(msgs))
		for i, m := range msgs {
			switch {
			case m.ID == "poison":
				failed[i] = idem.Permanent(errors.New("order rejected"))
				continue
			case m.ID == "retry" && retried.Add(1) == 1:
				failed[i] = errors.New("not yet")
				continue
			}
			if err := e.Insert(ctx, tx, m.ID); err != nil {
				return nil, err
			}
			results[i] = []byte("ok")
		}
		if calls.Add(1) == 1 {
			return nil, errors.New("the whole first batch fails") // after its inserts: rolled back
		}
		if len(failed) > 0 {
			return results, &consumer.PartialError{Failed: failed}
		}
		return results, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.config()
	cfg.TxBatchHandler = h
	good := append(ids("order", 120), "retry")
	r.publish(good[:60]...)
	r.publish("poison")
	r.publish(good[60:]...)
	r.publish(good[:30]...) // duplicate publishes
	c, stop := r.start(cfg)
	waitUntil(t, "every delivery settled", func() bool {
		s := c.Stats()
		return s.Handled+s.Duplicates == int64(len(good)+30) && s.DeadLettered == 1
	})
	stop()
	for _, id := range good {
		if n, st := e.Count(t, id), r.record(id).State; n != 1 || st != idem.StateCompleted {
			t.Errorf("%s: ledger %d, state %s; want 1, completed", id, n, st)
		}
	}
	if n, st := e.Count(t, "poison"), r.record("poison").State; n != 0 || st != idem.StateFailed {
		t.Errorf("poison: ledger %d, state %s; want 0, failed", n, st)
	}
	if dl := r.b.Published("orders.dead-letter"); len(dl) != 1 {
		t.Errorf("%d dead letters, want 1", len(dl))
	}
}

// testClassifies: an error of the effect's own statements that says the
// database is unreachable, which only the store's ClassifyError knows,
// holds the message and spends no attempt, even with the consumer's guard
// on another store: 8 such failures with MaxAttempts 3, then one effect,
// no nak, no dead letter.
func testClassifies[T any](t *testing.T, e Env[T], mode string) {
	if errors.Is(idem.ClassifyError(e.Unavailable), idem.ErrUnavailable) {
		t.Fatalf("%v is classified without the store: it proves nothing here", e.Unavailable)
	}
	r := newRun(t, e, true)
	var fails atomic.Int32
	effect := func(ctx context.Context, tx T, m *broker.Message) error {
		if fails.Add(1) <= 8 {
			return e.Unavailable
		}
		return e.Insert(ctx, tx, m.ID)
	}
	cfg := r.config()
	var err error
	if mode == "single" {
		cfg.TxHandler, err = e.TxHandler(func(ctx context.Context, tx T, m *broker.Message) ([]byte, error) {
			return nil, effect(ctx, tx, m)
		})
	} else {
		cfg.TxBatchHandler, err = e.TxBatchHandler(func(ctx context.Context, tx T, msgs []*broker.Message) ([][]byte, error) {
			return nil, effect(ctx, tx, msgs[0])
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	r.publish("o-1")
	c, stop := r.start(cfg)
	waitUntil(t, "the message handled", func() bool { return c.Stats().Handled == 1 })
	stop()
	s := c.Stats()
	if n := e.Count(t, "o-1"); n != 1 || s.Naked != 0 || s.DeadLettered != 0 || s.Holds == 0 {
		t.Fatalf("ledger %d, stats %+v; want one effect, held, never nak'ed or dead-lettered", n, s)
	}
}

// testDoTxInsideHandler: a plain consumer Handler (and a BatchHandler)
// commits its effect with the record through DoTx on the message's own
// key. The runtime holds that key's claim; DoTx runs the effect under it
// and completes it in the transaction. Before, DoTx found the runtime's
// own claim and answered in progress: the message was held until the
// consumer stopped and no effect ever ran. Some effects outlast the
// guard's heartbeat, whose Extend then waits on the row and finds the
// record completed: not a lost lease. A second DoTx in the same handler
// run replays.
func testDoTxInsideHandler[T any](t *testing.T, e Env[T], mode string) {
	r := newRun(t, e, false)
	var effects atomic.Int32
	req := func(id string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(id), Lease: time.Minute, TTL: time.Hour}
	}
	doTx := func(ctx context.Context, m *broker.Message) ([]byte, error) {
		c, err := e.DoTx(ctx, req(m.ID), func(ctx context.Context, tx T) ([]byte, error) {
			effects.Add(1)
			if m.ID[0] == 's' {
				time.Sleep(800 * time.Millisecond) // a heartbeat (every 667ms) lands meanwhile
			}
			return []byte("ok"), e.Insert(ctx, tx, m.ID)
		})
		if err != nil {
			return nil, err
		}
		if c.Outcome != idem.OutcomeAcquired || c.Record.State != idem.StateCompleted {
			return nil, fmt.Errorf("DoTx: %+v", c)
		}
		if m.ID == "twice" {
			again, err := e.DoTx(ctx, req(m.ID), func(context.Context, T) ([]byte, error) { return nil, errors.New("ran twice") })
			if err != nil || again.Outcome != idem.OutcomeCompleted || string(again.Record.Result) != "ok" {
				return nil, fmt.Errorf("second DoTx: %+v, %v", again, err)
			}
		}
		return c.Record.Result, nil
	}
	cfg := r.config()
	if mode == "single" {
		cfg.Handler = doTx
	} else {
		cfg.BatchHandler = func(ctx context.Context, msgs []*broker.Message) error {
			for _, m := range msgs {
				if _, err := doTx(ctx, m); err != nil {
					return err
				}
			}
			return nil
		}
	}
	all := append(append(ids("order", 30), ids("slow", 3)...), "twice")
	r.publish(all...)
	r.publish(all[:10]...)
	c, stop := r.start(cfg)
	waitUntil(t, "every delivery settled", func() bool {
		s := c.Stats()
		return s.Handled+s.Duplicates == int64(len(all)+10)
	})
	stop()
	for _, id := range all {
		if n, st := e.Count(t, id), r.record(id).State; n != 1 || st != idem.StateCompleted {
			t.Errorf("%s: ledger %d, state %s; want 1, completed", id, n, st)
		}
	}
	s := c.Stats()
	if effects.Load() != int32(len(all)) || s.Holds != 0 || s.Naked != 0 || r.lost.Load() != 0 {
		t.Fatalf("effects %d (want %d), stats %+v, leases lost %d", effects.Load(), len(all), s, r.lost.Load())
	}
}
