package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
)

// outageEnv is an env whose guard runs over a faultstore, on a broker with
// a delivery limit and a short ack wait.
type outageEnv struct {
	*env
	fs *faultstore.Store
	// txMu: transactions (storeTx) hold it for reading, setDown for
	// writing.
	txMu sync.RWMutex
}

// storeTx is storeTx over the faultstore, each call one transaction that
// an outage cannot cut in two: a real one (pgstore's) commits its claims,
// effects and completions together or not at all, while storeTx alone
// claims, records the effect and completes in separate calls. An outage
// that began between them left a claim with its one-minute lease and the
// effect done but not completed: the message was held until the test gave
// up (3 of 40 -race runs of TestStoreOutageLongerThanDeliveryLimitLosesNothing/tx),
// or would have run twice once the lease lapsed.
func (e *outageEnv) storeTx(led *ledger) consumer.TxBatchHandler {
	tx := storeTx(e.fs.WithBatch(), led)
	return func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		e.txMu.RLock()
		defer e.txMu.RUnlock()
		return tx(ctx, items)
	}
}

// setDown starts or ends the store outage between transactions.
func (e *outageEnv) setDown(down bool) {
	e.txMu.Lock()
	defer e.txMu.Unlock()
	e.fs.SetDown(down)
}

const (
	outageMaxDeliver = 3
	outageDownDelay  = 20 * time.Millisecond
)

func newOutageEnv(t *testing.T, guardOpts ...idem.Option) *outageEnv {
	t.Helper()
	b, err := membroker.New(membroker.Config{AckWait: 300 * time.Millisecond, MaxDeliver: outageMaxDeliver})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	fs := faultstore.New(inner)
	opts := append([]idem.Option{idem.WithLease(200 * time.Millisecond)}, guardOpts...)
	return &outageEnv{env: newEnvWith(t, b, fs.WithBatch(), opts...), fs: fs}
}

func (e *outageEnv) config() consumer.Config {
	cfg := e.env.config(e.sub("g"))
	cfg.StoreDownDelay = outageDownDelay
	cfg.InProgressInterval = 20 * time.Millisecond
	cfg.MaxInFlight = 64
	return cfg
}

// gate blocks the first n effects until it is opened, so a test can start
// an outage while they are in flight.
type gate struct {
	n       int64
	started atomic.Int64
	inside  chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate(n int64) *gate {
	return &gate{n: n, inside: make(chan struct{}, n), open: make(chan struct{})}
}

func (g *gate) pass() {
	if g.started.Add(1) <= g.n {
		g.inside <- struct{}{}
		<-g.open
	}
}

// waitInside waits until the n gated effects are running.
func (g *gate) waitInside(t *testing.T) {
	t.Helper()
	for range g.n {
		select {
		case <-g.inside:
		case <-time.After(20 * time.Second):
			t.Fatal("gated effects did not start")
		}
	}
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// TestStoreOutageLongerThanDeliveryLimitLosesNothing (issue 11.1, 11.3):
// the store goes down while messages are in flight (effects running,
// others fetched and queued) and stays down for many times MaxDeliver x
// StoreDownDelay and past the broker's ack wait and the guard's lease.
// Nothing may be nak'ed (each nak spends one of the broker's deliveries),
// no attempt may be spent, and afterwards every message takes effect
// exactly once with no dead letter and nothing dropped by the broker.
func TestStoreOutageLongerThanDeliveryLimitLosesNothing(t *testing.T) {
	for _, mode := range []string{"single", "batch", "tx", "txbatch", "steps"} {
		t.Run(mode, func(t *testing.T) {
			e := newOutageEnv(t)
			cfg := e.config()
			cfg.DeadLetter = e.b.NewPublisher()
			const n = 40
			led := newLedger()
			g := newGate(2)
			switch mode {
			case "single":
				cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
					g.pass()
					led.add(m.ID, "")
					return nil, nil
				}
			case "batch":
				cfg.Workers = 2
				cfg.Batch.Size = 4
				cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
					g.pass()
					for _, m := range ms {
						led.add(m.ID, "")
					}
					return nil
				}
			case "tx":
				tx := e.storeTx(led)
				cfg.TxHandler = func(ctx context.Context, it consumer.TxItem) (consumer.TxOutcome, error) {
					g.pass()
					outs, err := tx(ctx, []consumer.TxItem{it})
					if err != nil {
						return consumer.TxOutcome{}, err
					}
					return outs[0], nil
				}
			case "txbatch":
				cfg.Workers = 2
				cfg.Batch.Size = 4
				tx := e.storeTx(led)
				cfg.TxBatchHandler = func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
					g.pass()
					return tx(ctx, items)
				}
			case "steps":
				h, err := consumer.Steps(e.guard,
					consumer.Step{Name: "one", Run: func(ctx context.Context, m *broker.Message, _ map[string][]byte) ([]byte, error) {
						g.pass()
						led.add(m.ID+"/one", "")
						return nil, nil
					}},
					consumer.Step{Name: "two", Run: func(ctx context.Context, m *broker.Message, _ map[string][]byte) ([]byte, error) {
						led.add(m.ID, "")
						return nil, nil
					}})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Handler = h
			}
			var msgs []*broker.Message
			for i := range n {
				msgs = append(msgs, msg(fmt.Sprintf("m-%d", i), "x"))
			}
			e.publish(msgs...)
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			g.waitInside(t)
			e.setDown(true)
			if open := e.log.open(); open < 2 {
				t.Fatalf("%d deliveries in flight when the outage began", open)
			}
			g.release()
			// Far longer than the broker's delivery budget at one nak per
			// StoreDownDelay, than its ack wait and than the lease.
			time.Sleep(30 * outageMaxDeliver * outageDownDelay)
			if calls := e.fs.Calls(faultstore.OpClaim) + e.fs.Calls(faultstore.OpBatch); calls == 0 {
				t.Fatal("the outage hit no claim")
			}
			e.setDown(false)
			waitFor(t, "every message settled or lost", func() bool {
				if len(e.b.Exhausted(e.topic, "g")) > 0 || len(e.b.Published("orders.dead-letter")) > 0 {
					return true
				}
				for i := range n {
					if e.log.Acks(fmt.Sprintf("m-%d", i)) == 0 {
						return false
					}
				}
				return true
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if ex := e.b.Exhausted(e.topic, "g"); len(ex) > 0 {
				t.Fatalf("the broker dropped %d message(s) after their deliveries were spent: %v", len(ex), ex)
			}
			if dl := e.b.Published("orders.dead-letter"); len(dl) > 0 {
				t.Fatalf("%d dead letters after an outage", len(dl))
			}
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				if got := led.count(id); got != 1 {
					t.Fatalf("%s took effect %d times", id, got)
				}
			}
			if naks := e.log.totalNaks(); naks > 0 {
				t.Fatalf("%d naks: the outage spent broker deliveries", naks)
			}
			if mode != "txbatch" && mode != "tx" {
				for i := range n {
					rec, err := e.store.Get(context.Background(), []byte(fmt.Sprintf("m-%d", i)))
					if err != nil || rec.Attempts != 1 {
						t.Fatalf("m-%d: record %+v, %v; want 1 attempt", i, rec, err)
					}
				}
			}
		})
	}
}

// TestHeldHandedBackAtShutdown: a consumer that stops while it holds
// deliveries hands them back at once for another consumer (a nak, with no
// delay), releasing the claims it kept for them, instead of waiting for
// ShutdownTimeout.
func TestHeldHandedBackAtShutdown(t *testing.T) {
	for _, why := range []string{"store down", "handler unavailable"} {
		t.Run(why, func(t *testing.T) {
			oe := newOutageEnv(t, idem.WithLease(time.Minute))
			e := oe.env
			cfg := oe.config()
			cfg.ShutdownTimeout = time.Hour
			cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return nil, dialRefused() }
			if why == "store down" {
				oe.fs.SetDown(true)
			}
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			e.publish(msg("a", "x"), msg("b", "x"), msg("c", "x"))
			waitFor(t, "three held", func() bool { return c.Stats().HeldNow == 3 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			oe.fs.SetDown(false)
			for _, id := range []string{"a", "b", "c"} {
				if naks := e.log.Naks(id); len(naks) != 1 || naks[0] != 0 || e.log.Acks(id) != 0 {
					t.Fatalf("%s: naks %v, acks %d; want one nak without delay", id, naks, e.log.Acks(id))
				}
				rec, err := e.store.Get(context.Background(), []byte(id))
				switch why {
				case "store down":
					if !errors.Is(err, idem.ErrNotFound) {
						t.Fatalf("%s: record %+v, %v; want none (never claimed)", id, rec, err)
					}
				default:
					if err != nil || rec.State != idem.StateReleased || rec.Attempts != 1 {
						t.Fatalf("%s: record %+v, %v; want released after 1 attempt", id, rec, err)
					}
				}
			}
			if st := c.Stats(); st.HeldNow != 0 || st.Holds != 3 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestReleaseFailureHeldNotNaked: the handler fails and the store does not
// take the release: the message is kept (no nak, which would spend one of
// the broker's deliveries) and claimed again once our claim's lease has
// lapsed; a permanent failure whose Fail the store does not take is
// dead-lettered at once (the guard records the Fail in the background).
func TestReleaseFailureHeldNotNaked(t *testing.T) {
	oe := newOutageEnv(t)
	e := oe.env
	cfg := oe.config()
	cfg.DeadLetter = e.b.NewPublisher()
	var mu sync.Mutex
	runs := map[string]int{}
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		mu.Lock()
		runs[m.ID]++
		n := runs[m.ID]
		mu.Unlock()
		switch {
		case m.ID == "poison":
			return nil, idem.Permanent(errBoom)
		case n <= 3: // the first try and its two in-process retries
			return nil, errBoom
		}
		return nil, nil
	}
	oe.fs.Inject(faultstore.OpRelease, faultstore.Fault{})
	oe.fs.Inject(faultstore.OpFail, faultstore.Fault{})
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("flaky", "x"), msg("poison", "x"))
	waitFor(t, "flaky acked, poison terminated", func() bool { return e.log.Acks("flaky") == 1 && e.log.Terms("poison") == 1 })
	stop()
	if oe.fs.Calls(faultstore.OpRelease) == 0 || oe.fs.Calls(faultstore.OpFail) == 0 {
		t.Fatal("the faults hit no release or fail")
	}
	if n := e.log.totalNaks(); n != 0 {
		t.Fatalf("%d naks", n)
	}
	rec, err := e.store.Get(context.Background(), []byte("flaky"))
	if err != nil || rec.State != idem.StateCompleted || rec.Attempts != 2 {
		t.Fatalf("flaky: record %+v, %v; want completed on its second claim", rec, err)
	}
	if dl := e.b.Published("orders.dead-letter"); len(dl) != 1 || dl[0].Headers[consumer.HeaderOriginalID] != "poison" {
		t.Fatalf("dead letters %v", dl)
	}
}
