package consumer_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/internal/clocktest"
	"github.com/idem-dev/idem/memstore"
)

// manualClock moves only when the test advances it (see clocktest).
type manualClock = clocktest.Manual

// TestHeldClaimLostNotRunTwice: a message is held with its claim kept
// (its handler's database unavailable); meanwhile the claim's heartbeats
// fail (the store unreachable from this process only) for longer than the
// lease, and another process takes the key over and runs the effect. When
// the handler's database is back, the held message must not run the
// effect again under the stale claim: it renews the claim first, finds it
// lost, and settles as for a lost lease (the redelivery is a duplicate).
func TestHeldClaimLostNotRunTwice(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			clk := clocktest.New()
			mem, err := memstore.New(memstore.Config{Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { mem.Close() })
			fs := faultstore.New(mem)
			b, err := membroker.New(membroker.Config{AckWait: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			const lease = 2 * time.Second
			e := newEnvWith(t, b, fs.WithBatch(), idem.WithLease(lease), idem.WithClock(clk))
			rival, err := idem.NewGuard(mem, idem.WithLease(lease), idem.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rival.Close() })

			led := newLedger()
			var healthy atomic.Bool
			var held, heldStore atomic.Int64
			cfg := e.config(e.sub("g"))
			cfg.Workers = 1
			cfg.Hooks.OnHold = func(_ context.Context, ev consumer.HoldEvent) {
				switch ev.Reason {
				case consumer.HoldHandlerUnavailable:
					held.Add(1)
				case consumer.HoldStoreUnavailable:
					heldStore.Add(1)
				}
			}
			setEffect(&cfg, mode, func(m *broker.Message) error {
				if !healthy.Load() {
					return fmt.Errorf("%w: the handler's database", idem.ErrUnavailable)
				}
				led.add(m.ID, "consumer")
				return nil
			})
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			e.publish(msg("m1", "p"))
			waitFor(t, "the message held with its claim", func() bool { return held.Load() > 0 })

			fs.Inject(faultstore.OpExtend, faultstore.Fault{}) // heartbeats fail from here
			fs.Inject(faultstore.OpExtendBatch, faultstore.Fault{})
			clk.Advance(3 * lease)
			if _, err := rival.Do(context.Background(), []byte("m1"), func(context.Context) ([]byte, error) {
				led.add("m1", "rival")
				return nil, nil
			}); err != nil {
				t.Fatalf("rival: %v", err)
			}
			healthy.Store(true)
			// A held retry while the extends fail (held again, or, without
			// the renewal, the effect run again); then the store answers
			// this process again.
			waitFor(t, "a retry of the held message", func() bool { return heldStore.Load() > 0 || led.count("m1") > 1 })
			fs.Clear()
			waitFor(t, "the message acked", func() bool { return e.log.Acks("m1") > 0 })
			stop()
			if n := led.count("m1"); n != 1 {
				t.Fatalf("effect ran %d times (%v), want once", n, led.order["m1"])
			}
		})
	}
}

// TestPanickingCallbacksDoNotCrash: every user function the runtime calls
// besides the handler (the error classifier, the hooks, Batch.GroupBy,
// DeadLetterTopic) may panic: the panic is logged and turned into that
// message's error (or ignored, for an observer), never a crash of the
// process nor a message left unsettled.
func TestPanickingCallbacksDoNotCrash(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.DeadLetter = e.b.NewPublisher()
			cfg.MaxAttempts = 2
			boom := func() { panic("callback bug") }
			cfg.ClassifyError = func(error) error { boom(); return nil }
			cfg.DeadLetterTopic = func(*broker.Message) string { boom(); return "" }
			cfg.Hooks = consumer.Hooks{
				OnAck:        func(context.Context, consumer.AckEvent) { boom() },
				OnNak:        func(context.Context, consumer.NakEvent) { boom() },
				OnHold:       func(context.Context, consumer.HoldEvent) { boom() },
				OnDeadLetter: func(context.Context, consumer.DeadLetterEvent) { boom() },
				OnUnrecorded: func(context.Context, consumer.UnrecordedEvent) { boom() },
			}
			if mode == "batch" {
				cfg.Batch.GroupBy = func(m *broker.Message) string {
					if m.ID == "grouped-bug" {
						boom()
					}
					return ""
				}
			}
			setEffect(&cfg, mode, func(m *broker.Message) error {
				if m.ID == "poison" {
					return errBoom
				}
				return nil
			})
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			run(t, c)
			ids := []string{"ok", "poison"}
			if mode == "batch" {
				ids = append(ids, "grouped-bug")
			}
			for _, id := range ids {
				e.publish(msg(id, "p"))
			}
			waitFor(t, "every message settled", func() bool {
				return e.log.Acks("ok") > 0 && e.log.Terms("poison") > 0 && (mode != "batch" || e.log.Terms("grouped-bug") > 0)
			})
		})
	}
}

// TestBatchFingerprintMismatchDecidedByStore: two messages of one key
// with different payloads in one batch. Which of them is the key's own
// payload is the store's answer, not the batch's order: K was completed
// with payload "one"; a batch bringing (K, "two") first and then (K,
// "one") must dead-letter the first (fingerprint mismatch) and ack the
// second as a duplicate, not dead-letter it for differing from the first.
func TestBatchFingerprintMismatchDecidedByStore(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1
	cfg.Batch.Size = 10
	cfg.Batch.Wait = 200 * time.Millisecond
	cfg.DeadLetter = e.b.NewPublisher()
	cfg.Key = func(m *broker.Message) ([]byte, error) { return m.Key, nil }
	led := newLedger()
	setEffect(&cfg, "batch", func(m *broker.Message) error { led.add(string(m.Key), m.ID); return nil })
	km := func(id, key, payload string) *broker.Message {
		m := msg(id, payload)
		m.Key = []byte(key)
		return m
	}
	// K completed earlier with payload "one".
	first := km("first", "K", "one")
	if _, err := e.guard.Do(context.Background(), []byte("K"), func(context.Context) ([]byte, error) { return nil, nil },
		idem.WithFingerprint(consumer.PayloadFingerprint(first))); err != nil {
		t.Fatal(err)
	}
	e.publish(km("reuse", "K", "two"), km("redelivery", "K", "one"))
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "both settled", func() bool {
		return e.log.Acks("reuse")+e.log.Terms("reuse") > 0 && e.log.Acks("redelivery")+e.log.Terms("redelivery") > 0
	})
	stop()
	if e.log.Terms("reuse") != 1 {
		t.Fatalf("the reused key with another payload was not dead-lettered (acks %d)", e.log.Acks("reuse"))
	}
	if e.log.Acks("redelivery") != 1 || e.log.Terms("redelivery") != 0 {
		t.Fatalf("the message with the key's own payload: acks %d, terms %d; want acked as a duplicate",
			e.log.Acks("redelivery"), e.log.Terms("redelivery"))
	}
	if led.count("K") != 0 {
		t.Fatalf("effect ran %d times for a completed key", led.count("K"))
	}
}

// TestHandlerUnavailableHoldIsBounded: a handler whose own system stays
// unavailable is held without spending attempts, but not for ever: after
// MaxUnavailableHold the error counts as a failed attempt, so a message
// whose error is misclassified (a wrong password reported as "cannot
// connect") or whose system never comes back ends dead-lettered after
// MaxAttempts, instead of holding its slot for ever.
func TestHandlerUnavailableHoldIsBounded(t *testing.T) {
	for _, mode := range []string{"single", "batch", "tx", "txbatch", "steps"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.MaxAttempts = 2
			cfg.MaxUnavailableHold = 30 * time.Millisecond
			cfg.DeadLetter = e.b.NewPublisher()
			var runs atomic.Int64
			down := func() error {
				runs.Add(1)
				return fmt.Errorf("%w: the handler's database", idem.ErrUnavailable)
			}
			led := newLedger()
			switch mode {
			case "single", "batch":
				setEffect(&cfg, mode, func(*broker.Message) error { return down() })
			case "tx":
				cfg.TxHandler = func(context.Context, consumer.TxItem) (consumer.TxOutcome, error) {
					return consumer.TxOutcome{}, down()
				}
			case "txbatch":
				cfg.TxBatchHandler = func(context.Context, []consumer.TxItem) ([]consumer.TxOutcome, error) {
					return nil, down()
				}
			case "steps":
				h, err := consumer.Steps(e.guard, consumer.Step{Name: "charge",
					Run: func(context.Context, *broker.Message, map[string][]byte) ([]byte, error) { return nil, down() }})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Handler = h
			}
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			run(t, c)
			e.publish(msg("m1", "p"))
			waitFor(t, "the message dead-lettered", func() bool { return e.log.Terms("m1") == 1 })
			if led.total() != 0 {
				t.Fatal("an effect ran")
			}
			if runs.Load() < 2 {
				t.Fatalf("the handler ran %d times: the hold did not retry before giving up", runs.Load())
			}
			dl := e.b.Published("orders.dead-letter")
			if len(dl) != 1 {
				t.Fatalf("%d dead letters", len(dl))
			}
		})
	}
}

// dlTakeover is a store on which, right after this process claims a
// dead-letter key, the process stalls past the lease and another one takes
// the key over and dead-letters the message (rival.Do): a SIGSTOP between
// the claim and the publish.
type dlTakeover struct {
	idem.Store
	clk   *manualClock
	lease time.Duration
	rival *idem.Guard
	done  atomic.Bool
}

func (s *dlTakeover) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := s.Store.Claim(ctx, req)
	if err == nil && bytes.HasPrefix(req.Key, []byte("dead-letter:")) && s.done.CompareAndSwap(false, true) {
		s.clk.Advance(3 * s.lease)
		if _, rerr := s.rival.Do(ctx, req.Key, func(context.Context) ([]byte, error) { return nil, nil }); rerr != nil {
			return c, fmt.Errorf("rival: %w", rerr)
		}
	}
	return c, err
}

// A stale holder of a dead-letter key must not publish: the holder that
// took it over has published it (chaos mixed/redis/kafka: a consumer
// SIGSTOPped after claiming the dead-letter key published it again after
// SIGCONT, and only its Complete was fenced: msg-0029513 twice on a Kafka
// dead-letter topic, which has no dedup by id). The claim is renewed
// before the publish.
func TestStaleDeadLetterHolderDoesNotPublish(t *testing.T) {
	clk := clocktest.New()
	mem, err := memstore.New(memstore.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	b, err := membroker.New(membroker.Config{AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const lease = 2 * time.Second
	rival, err := idem.NewGuard(mem, idem.WithLease(lease), idem.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rival.Close() })
	st := &dlTakeover{Store: mem, clk: clk, lease: lease, rival: rival}
	e := newEnvWith(t, b, st, idem.WithLease(lease), idem.WithClock(clk))
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1
	cfg.DeadLetter = e.b.NewPublisher()
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		return nil, idem.Permanent(errBoom)
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	e.publish(msg("poison", "x"))
	waitFor(t, "the message settled", func() bool { return e.log.Terms("poison")+e.log.Acks("poison") > 0 })
	stop()
	if !st.done.Load() {
		t.Fatal("the dead-letter key was never claimed")
	}
	if n := len(e.b.Published("orders.dead-letter")); n != 0 {
		t.Fatalf("the stale holder published %d dead letter(s); the rival had published it", n)
	}
}
