package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
)

// holdKeyElsewhere claims key on g as another worker would, keeping it in
// progress (heartbeat on) until the returned func releases it.
func holdKeyElsewhere(t *testing.T, g *idem.Guard, key string) (release func()) {
	t.Helper()
	h, _, err := g.Acquire(context.Background(), []byte(key))
	if err != nil || h == nil {
		t.Fatalf("acquire %q: %v", key, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := h.Release(context.Background(), errors.New("test: done elsewhere")); err != nil {
				t.Errorf("release: %v", err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// TestLastDeliveryIsNeverHandedBack (issue 11.1): a message whose key is
// in progress elsewhere is nak'ed until its last broker delivery; that one
// must be kept and retried in process (a nak would make the broker drop it
// for good), without stopping other order keys on the same worker, and it
// takes effect once the key is free.
func TestLastDeliveryIsNeverHandedBack(t *testing.T) {
	e := newEnvBroker(t, membroker.Config{AckWait: 5 * time.Second, MaxDeliver: 2}, idem.WithLease(300*time.Millisecond))
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1 // everything shares the worker the held message is on
	cfg.DeadLetter = e.b.NewPublisher()
	led := newLedger()
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		led.add(m.ID, "")
		return nil, nil
	}
	release := holdKeyElsewhere(t, e.guard, "busy")
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("busy", "x"))
	waitFor(t, "the last delivery", func() bool { return e.log.Delivery("busy") == 2 })
	var others []*broker.Message
	for i := range 20 {
		others = append(others, msg(fmt.Sprint("other-", i), "x"))
	}
	e.publish(others...)
	waitFor(t, "the other keys", func() bool { return led.total() == 20 || len(e.b.Exhausted(e.topic, "g")) > 0 })
	if ex := e.b.Exhausted(e.topic, "g"); len(ex) > 0 {
		t.Fatalf("the broker dropped %v: the last delivery was handed back", ex)
	}
	release()
	waitFor(t, "busy handled", func() bool { return e.log.Acks("busy") == 1 || len(e.b.Exhausted(e.topic, "g")) > 0 })
	stop()
	if ex := e.b.Exhausted(e.topic, "g"); len(ex) > 0 {
		t.Fatalf("the broker dropped %v", ex)
	}
	if led.count("busy") != 1 || len(e.b.Published("orders.dead-letter")) != 0 {
		t.Fatalf("busy took effect %d times, %d dead letters", led.count("busy"), len(e.b.Published("orders.dead-letter")))
	}
	if naks := e.log.Naks("busy"); len(naks) != 1 {
		t.Fatalf("busy nak'ed %d times, want once (its first delivery only)", len(naks))
	}
}

// TestLastDeliveryDeadLetteredAtShutdown (issue 11.1): a consumer that
// stops while it keeps a message on its last delivery dead-letters it
// (saying why) instead of naking it into the broker's silent drop.
func TestLastDeliveryDeadLetteredAtShutdown(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnvBroker(t, membroker.Config{AckWait: 5 * time.Second, MaxDeliver: 2}, idem.WithLease(300*time.Millisecond))
			cfg := e.config(e.sub("g"))
			cfg.DeadLetter = e.b.NewPublisher()
			setEffect(&cfg, mode, func(*broker.Message) error { return nil })
			holdKeyElsewhere(t, e.guard, "busy")
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			e.publish(msg("busy", "x"))
			waitFor(t, "the last delivery", func() bool { return e.log.Delivery("busy") == 2 })
			time.Sleep(20 * time.Millisecond) // let it be held (or, before the fix, nak'ed)
			stop()
			if ex := e.b.Exhausted(e.topic, "g"); len(ex) > 0 {
				t.Fatalf("the broker dropped %v", ex)
			}
			dl := e.b.Published("orders.dead-letter")
			if len(dl) != 1 || dl[0].Headers[consumer.HeaderOriginalID] != "busy" ||
				!strings.Contains(dl[0].Headers[consumer.HeaderDeadLetterReason], "delivery limit") {
				t.Fatalf("dead letters %v", dl)
			}
			if e.log.Terms("busy") != 1 {
				t.Fatal("dead-lettered message not terminated")
			}
		})
	}
}

// TestDeadLetterPerMessageNotPerKey (issue 11.2): distinct messages that
// share an idempotency key each reach the dead-letter topic once, with
// dead-letter ids of their own; a redelivery of one of them does not
// publish it again.
func TestDeadLetterPerMessageNotPerKey(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.Workers = 1
			cfg.Batch.Wait = 50 * time.Millisecond
			cfg.DeadLetter = e.b.NewPublisher()
			cfg.Key = func(m *broker.Message) ([]byte, error) { return m.Key, nil }
			fail := func(m *broker.Message) error {
				if string(m.Payload) == "poison" {
					return idem.Permanent(errBoom)
				}
				return nil
			}
			setEffect(&cfg, mode, fail)
			km := func(id, key, payload string) *broker.Message {
				m := msg(id, payload)
				m.Key = []byte(key)
				return m
			}
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			// a: poison, K marked failed. b: K reused with another payload
			// (fingerprint mismatch). c: K reused with a's payload (K is
			// failed). a again: a redelivery of a, already dead-lettered.
			e.publish(km("a", "K", "poison"))
			waitFor(t, "a settled", func() bool { return e.log.Terms("a") == 1 })
			e.publish(km("b", "K", "other"), km("c", "K", "poison"), km("a", "K", "poison"))
			// d and e share K2 in one batch with different payloads.
			e.publish(km("d", "K2", "one"), km("e", "K2", "two"))
			waitFor(t, "all settled", func() bool {
				return e.log.Terms("a") == 2 && e.log.Terms("b") == 1 && e.log.Terms("c") == 1 &&
					e.log.Acks("d")+e.log.Terms("d") == 1 && e.log.Terms("e") == 1
			})
			stop()
			got := map[string]int{}
			ids := map[string]bool{}
			for _, m := range e.b.Published("orders.dead-letter") {
				got[m.Headers[consumer.HeaderOriginalID]]++
				ids[m.ID] = true
			}
			want := map[string]int{"a": 1, "b": 1, "c": 1, "e": 1}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("dead letters by original id %v, want %v", got, want)
			}
			if len(ids) != 4 {
				t.Fatalf("%d distinct dead-letter ids for 4 messages", len(ids))
			}
		})
	}
}

// failingPublisher fails every publish of a message whose original id is
// in bad, until healed.
type failingPublisher struct {
	broker.Publisher
	mu    sync.Mutex
	bad   map[string]bool
	fails atomic.Int64
}

func (p *failingPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if p.bad[m.Headers[consumer.HeaderOriginalID]] {
			p.fails.Add(1)
			return errors.New("test: dead-letter topic refuses the message")
		}
	}
	return p.Publisher.Publish(ctx, msgs...)
}

func (p *failingPublisher) heal() {
	p.mu.Lock()
	p.bad = nil
	p.mu.Unlock()
}

// TestDeadLetterPublishFailureHoldsOnlyItsKey (issue 11.4): a poison
// message whose dead-letter publish keeps failing holds back only itself
// and the later messages of its order key; the store is not treated as
// down (StoreDownDelay is an hour: pausing fetching would stop
// everything), and the rest flows. Once the dead-letter topic accepts it,
// it is published once and its order key resumes in order.
func TestDeadLetterPublishFailureHoldsOnlyItsKey(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.Workers = 1
			cfg.StoreDownDelay = time.Hour
			dlp := &failingPublisher{Publisher: e.b.NewPublisher(), bad: map[string]bool{"poison": true}}
			cfg.DeadLetter = dlp
			led := newLedger()
			effect := func(m *broker.Message) error {
				if m.ID == "poison" {
					return idem.Permanent(errBoom)
				}
				led.add(string(m.Key), m.ID)
				return nil
			}
			setEffect(&cfg, mode, effect)
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			km := func(id, key string) *broker.Message {
				m := msg(id, "x")
				m.Key = []byte(key)
				return m
			}
			e.publish(km("poison", "acct-1"))
			waitFor(t, "a failed dead-letter publish", func() bool { return dlp.fails.Load() > 0 })
			e.publish(km("after", "acct-1"))
			var others []*broker.Message
			for i := range 50 {
				others = append(others, km(fmt.Sprint("other-", i), fmt.Sprint("acct-x", i)))
			}
			e.publish(others...)
			waitFor(t, "the other keys", func() bool {
				for i := range 50 {
					if e.log.Acks(fmt.Sprint("other-", i)) == 0 {
						return false
					}
				}
				return true
			})
			if led.count("acct-1") != 0 {
				t.Fatal("a later message of the held order key ran before the held one")
			}
			if e.log.Acks("poison")+e.log.Terms("poison")+len(e.log.Naks("poison")) != 0 {
				t.Fatalf("poison settled while its dead-letter publish failed: acks %d terms %d naks %v",
					e.log.Acks("poison"), e.log.Terms("poison"), e.log.Naks("poison"))
			}
			dlp.heal()
			waitFor(t, "poison dead-lettered and its key resumed", func() bool {
				return e.log.Terms("poison") == 1 && e.log.Acks("after") == 1
			})
			stop()
			if n := len(e.b.Published("orders.dead-letter")); n != 1 {
				t.Fatalf("%d dead letters, want 1", n)
			}
			if st := c.Stats(); st.StoreErrors != 0 {
				t.Fatalf("a dead-letter publish failure counted as a store failure: %+v", st)
			}
		})
	}
}

// slowCompleteStore delays every completion.
type slowCompleteStore struct {
	idem.Store
	delay time.Duration
	calls atomic.Int64
}

func (s *slowCompleteStore) Complete(ctx context.Context, k []byte, tok uint64, res []byte) error {
	s.calls.Add(1)
	time.Sleep(s.delay)
	return s.Store.Complete(ctx, k, tok, res)
}

func (s *slowCompleteStore) ClaimBatch(ctx context.Context, rs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	return s.Store.(idem.BatchClaimer).ClaimBatch(ctx, rs)
}

func (s *slowCompleteStore) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	s.calls.Add(1)
	time.Sleep(s.delay)
	return s.Store.(idem.BatchCompleter).CompleteBatch(ctx, cs)
}

// TestInProgressUntilAcked (issue 11.6, consumer side): the broker is told
// the message is in progress until it is acked, not only while the
// handler runs: a completion slower than the broker's ack wait must not
// let the broker redeliver.
func TestInProgressUntilAcked(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			base := newEnvBroker(t, membroker.Config{AckWait: 500 * time.Millisecond})
			ss := &slowCompleteStore{Store: base.store, delay: 1500 * time.Millisecond}
			e := newEnvWith(t, base.b, ss, idem.WithLease(10*time.Second))
			cfg := e.config(e.sub("g"))
			cfg.InProgressInterval = 50 * time.Millisecond
			setEffect(&cfg, mode, func(*broker.Message) error { return nil })
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			e.publish(msg("a", "x"), msg("b", "x"))
			waitFor(t, "acks", func() bool { return e.log.Acks("a") >= 1 && e.log.Acks("b") >= 1 })
			stop()
			if ss.calls.Load() == 0 {
				t.Fatal("no completion went through the slow store")
			}
			if d := max(e.log.Delivery("a"), e.log.Delivery("b")); d != 1 {
				t.Fatalf("redelivered (delivery %d) while its completion was being recorded", d)
			}
		})
	}
}
