package consumer_test

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
)

// cutSub models a subscriber whose connection drops (RabbitMQ) in two
// steps the test drives: lose makes every delivery handed out and not
// settled yet lost (its Acker reports broker.ErrDeliveryLost from then
// on, and reaches the broker no more); redeliver hands those deliveries
// back to the broker, which delivers them again. Between the two the
// consumer notices the loss through its InProgress signal.
//
// With notify, its Ackers are broker.LostNotifiers, whose channel lose
// closes (one per "connection": lose starts another).
type cutSub struct {
	broker.Subscriber
	limit  int  // MaxDeliveries reported; 0: none
	notify bool // Ackers implement broker.LostNotifier

	mu   sync.Mutex
	open map[*cutAcker]bool
	cut  []*cutAcker
	dead chan struct{} // the current connection's Lost channel
}

func newCutSub(inner broker.Subscriber) *cutSub {
	return &cutSub{Subscriber: inner, open: map[*cutAcker]bool{}, dead: make(chan struct{})}
}

func (s *cutSub) Fetch(ctx context.Context, n int) ([]*broker.Message, error) {
	msgs, err := s.Subscriber.Fetch(ctx, n)
	s.mu.Lock()
	for _, m := range msgs {
		a := &cutAcker{Acker: m.Acker, s: s, dead: s.dead}
		m.Acker = a
		if s.notify {
			m.Acker = notifyingAcker{a}
		}
		s.open[a] = true
	}
	s.mu.Unlock()
	return msgs, err
}

func (s *cutSub) MaxDeliveries() int { return s.limit }

// lose makes the unsettled deliveries lost; it returns how many.
func (s *cutSub) lose() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a := range s.open {
		a.lost = true
		s.cut = append(s.cut, a)
	}
	clear(s.open)
	close(s.dead)
	s.dead = make(chan struct{})
	return len(s.cut)
}

// redeliver hands the lost deliveries back to the broker.
func (s *cutSub) redeliver(t *testing.T) {
	s.mu.Lock()
	cut := s.cut
	s.cut = nil
	s.mu.Unlock()
	for _, a := range cut {
		if err := a.Acker.Nak(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
	}
}

type cutAcker struct {
	broker.Acker
	s    *cutSub
	dead chan struct{} // its connection's Lost channel
	lost bool          // guarded by s.mu
}

// notifyingAcker is a cutAcker that is a broker.LostNotifier.
type notifyingAcker struct{ *cutAcker }

func (a notifyingAcker) Lost() <-chan struct{} { return a.dead }

// gone reports whether the delivery is lost; settling it otherwise takes
// it out of the open set.
func (a *cutAcker) gone(settle bool) error {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	if a.lost {
		return fmt.Errorf("test: connection cut: %w", broker.ErrDeliveryLost)
	}
	if settle {
		delete(a.s.open, a)
	}
	return nil
}

func (a *cutAcker) Ack(ctx context.Context) error {
	if err := a.gone(true); err != nil {
		return err
	}
	return a.Acker.Ack(ctx)
}

func (a *cutAcker) Nak(ctx context.Context, d time.Duration) error {
	if err := a.gone(true); err != nil {
		return err
	}
	return a.Acker.Nak(ctx, d)
}

func (a *cutAcker) Term(ctx context.Context, reason string) error {
	if err := a.gone(true); err != nil {
		return err
	}
	return a.Acker.Term(ctx, reason)
}

func (a *cutAcker) InProgress(ctx context.Context) error {
	if err := a.gone(false); err != nil {
		return err
	}
	return a.Acker.InProgress(ctx)
}

// cutSub returns a cutSub of group g, and the subscriber to consume from:
// it over the cutSub, recording every settle call the consumer makes.
func (e *env) cutSub(g string) (*cutSub, broker.Subscriber) {
	s := newCutSub(e.b.NewSubscriber(e.topic, g))
	return s, &recSub{Subscriber: s, log: e.log}
}

// lostConfig is the tests' config over sub, with a short
// InProgressInterval (the consumer's way of noticing a loss).
func (e *env) lostConfig(sub broker.Subscriber) consumer.Config {
	cfg := e.config(sub)
	cfg.InProgressInterval = 10 * time.Millisecond
	cfg.DeadLetter = e.b.NewPublisher()
	return cfg
}

// runA starts a consumer with cfg and publishes message "a".
func (e *env) runA(t *testing.T, cfg consumer.Config) (c *consumer.Consumer, stop func() error) {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop = run(t, c)
	e.publish(msg("a", "x"))
	return c, stop
}

// waitLetGo waits until c noticed one lost delivery and let go of it.
func waitLetGo(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	waitFor(t, "the lost delivery let go", func() bool {
		s := c.Stats()
		return s.Lost == 1 && s.InFlight == 0 && s.HeldNow == 0
	})
}

// inProgress reports whether key's record is in progress (claimed).
func inProgress(t *testing.T, st idem.Store, key string) bool {
	t.Helper()
	rec, err := st.Get(context.Background(), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return rec.State == idem.StateInProgress
}

// TestLostWhileHeldForItsHandler: a delivery held with its claim (its
// handler's database unavailable) is lost (its connection dropped). The
// consumer lets go of it at once: the claim is released (not extended
// until the lease lapses), no slot is kept, nothing is nak'ed or
// dead-lettered; the redelivered copy then acquires the key at once (no
// "in progress elsewhere" nak) and takes effect once.
func TestLostWhileHeldForItsHandler(t *testing.T) {
	for _, mode := range []string{"single", "batch", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			sub, rec := e.cutSub("g")
			cfg := e.lostConfig(rec)
			led := newLedger()
			var held atomic.Int64 // handler runs that found the database down
			effect := func(m *broker.Message) error {
				if m.Delivery == 1 {
					held.Add(1)
					return fmt.Errorf("%w: database down", idem.ErrUnavailable)
				}
				led.add(m.ID, "")
				return nil
			}
			if mode == "tx" { // no runtime claim: the transaction's own
				cfg.TxHandler = func(ctx context.Context, it consumer.TxItem) (consumer.TxOutcome, error) {
					if err := effect(it.Msg); err != nil {
						return consumer.TxOutcome{}, err
					}
					return consumer.TxOutcome{Status: consumer.TxDone}, nil
				}
			} else {
				setEffect(&cfg, mode, effect)
			}
			c, stop := e.runA(t, cfg)
			waitFor(t, "the delivery held", func() bool { return c.Stats().HeldNow == 1 && held.Load() > 0 })
			if n := sub.lose(); n != 1 {
				t.Fatalf("lost %d deliveries, want 1", n)
			}
			waitLetGo(t, c)
			if mode != "tx" && inProgress(t, e.store, "a") {
				t.Fatal("the lost delivery's claim is still held: the redelivered copy would wait for its lease")
			}
			sub.redeliver(t)
			waitFor(t, "the redelivered copy handled", func() bool { return e.log.Acks("a") == 1 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			s := c.Stats()
			if led.count("a") != 1 || len(e.log.Naks("a")) != 0 || e.log.Terms("a") != 0 || s.DeadLettered != 0 || s.Lost != 1 || s.SettleErrors != 0 {
				t.Fatalf("effects %d, naks %v, terms %d, stats %+v; want 1 effect, no nak, no term, 1 lost, no settle error",
					led.count("a"), e.log.Naks("a"), e.log.Terms("a"), s)
			}
		})
	}
}

// TestLostNoticedAtOnce: with Ackers that are broker.LostNotifiers, a
// held delivery is let go as soon as its channel closes, without waiting
// for an InProgress round (an hour apart here).
func TestLostNoticedAtOnce(t *testing.T) {
	e := newEnv(t)
	sub, _ := e.cutSub("g")
	sub.notify = true
	cfg := e.lostConfig(sub) // not through recSub, whose Ackers are no LostNotifiers
	cfg.InProgressInterval = time.Hour
	led := newLedger()
	var healed atomic.Bool
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		if !healed.Load() {
			return nil, fmt.Errorf("%w: database down", idem.ErrUnavailable)
		}
		led.add(m.ID, "")
		return nil, nil
	}
	c, stop := e.runA(t, cfg)
	waitFor(t, "the delivery held", func() bool { return c.Stats().HeldNow == 1 })
	sub.lose()
	waitLetGo(t, c)
	if inProgress(t, e.store, "a") {
		t.Fatal("the lost delivery's claim is still held")
	}
	healed.Store(true)
	sub.redeliver(t)
	waitFor(t, "the redelivered copy handled", func() bool { return c.Stats().Handled == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); led.count("a") != 1 || s.Naked != 0 || s.Lost != 1 {
		t.Fatalf("effects %d, stats %+v; want 1 effect, no nak, 1 lost", led.count("a"), s)
	}
}

// TestLostWhileHandlerRuns: a delivery lost while its handler runs. The
// handler runs to its end. If it fails, it is not retried (neither in
// process nor by a nak): its claim is released and the redelivered copy
// takes effect. If it succeeds, its completion is recorded and the
// redelivered copy is acked as a duplicate.
func TestLostWhileHandlerRuns(t *testing.T) {
	for _, outcome := range []string{"fails", "succeeds"} {
		t.Run(outcome, func(t *testing.T) {
			e := newEnv(t)
			sub, rec := e.cutSub("g")
			cfg := e.lostConfig(rec)
			cfg.InProcessRetries = 3
			led := newLedger()
			running, finish := make(chan struct{}), make(chan struct{})
			var finishOnce sync.Once
			letFinish := func() { finishOnce.Do(func() { close(finish) }) }
			var firstRuns atomic.Int64
			cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
				if m.Delivery == 1 {
					if firstRuns.Add(1) == 1 {
						close(running)
						<-finish
					}
					if outcome == "fails" {
						return nil, errBoom
					}
				}
				led.add(m.ID, "")
				return nil, nil
			}
			c, stop := e.runA(t, cfg)
			t.Cleanup(letFinish) // before stop's, if the test fails first
			<-running
			sub.lose()
			waitFor(t, "the loss noticed", func() bool { return c.Stats().Lost == 1 })
			letFinish()
			waitLetGo(t, c)
			sub.redeliver(t)
			acks := 1 // the redelivered copy's
			if outcome == "succeeds" {
				acks = 2 // and the lost delivery's, which the broker refused
			}
			waitFor(t, "the redelivered copy settled", func() bool { return e.log.Acks("a") == acks })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			s := c.Stats()
			if firstRuns.Load() != 1 || led.count("a") != 1 || len(e.log.Naks("a")) != 0 || s.DeadLettered != 0 || s.SettleErrors != 0 {
				t.Fatalf("first delivery ran %d times, effects %d, naks %v, stats %+v; want 1 run, 1 effect, no nak, no settle error",
					firstRuns.Load(), led.count("a"), e.log.Naks("a"), s)
			}
			if outcome == "succeeds" && (s.Handled != 1 || s.Duplicates != 1) {
				t.Fatalf("stats %+v: want the first delivery handled and the redelivered copy a duplicate", s)
			}
		})
	}
}

// TestLostOnLastDelivery: a message kept in process on its last broker
// delivery (broker.DeliveryLimiter) because its handler fails is lost: it
// is neither kept nor dead-lettered (the broker has it again), and its
// redelivered copy takes effect. Before, the consumer kept retrying the
// lost delivery in process (until its attempts were used up, and then
// dead-lettered it).
func TestLostOnLastDelivery(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) { testLostOnLastDelivery(t, mode) })
	}
}

func testLostOnLastDelivery(t *testing.T, mode string) {
	e := newEnv(t)
	sub, rec := e.cutSub("g")
	sub.limit = 2
	cfg := e.lostConfig(rec)
	cfg.MaxAttempts = 1000 // retried in process until the loss, not dead-lettered for its attempts
	led := newLedger()
	setEffect(&cfg, mode, func(m *broker.Message) error {
		if m.Delivery <= 2 {
			return errBoom
		}
		led.add(m.ID, "")
		return nil
	})
	c, stop := e.runA(t, cfg)
	waitFor(t, "the last delivery held", func() bool {
		s := c.Stats()
		return e.log.Delivery("a") == 2 && s.HeldNow == 1 && s.Holds > 0
	})
	if n := sub.lose(); n != 1 {
		t.Fatalf("lost %d deliveries, want 1", n)
	}
	waitLetGo(t, c)
	sub.redeliver(t)
	waitFor(t, "the redelivered copy handled", func() bool { return e.log.Acks("a") == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if led.count("a") != 1 || s.DeadLettered != 0 || len(e.b.Published("orders.dead-letter")) != 0 || e.log.Terms("a") != 0 {
		t.Fatalf("effects %d, dead letters %d, terms %d, stats %+v; want 1 effect and no dead letter",
			led.count("a"), len(e.b.Published("orders.dead-letter")), e.log.Terms("a"), s)
	}
}
