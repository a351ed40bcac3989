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
	"github.com/idem-dev/idem/internal/leakcheck"
	"github.com/idem-dev/idem/memstore"
)

// TestMain checks for leaked goroutines (the core module takes no
// third-party code, so internal/leakcheck instead of goleak).
func TestMain(m *testing.M) { leakcheck.Main(m) }

// settleLog records how each delivery was settled.
type settleLog struct {
	mu      sync.Mutex
	acks    map[string]int // by message id
	naks    map[string][]time.Duration
	terms   map[string]int
	deliv   map[string]int // highest Delivery seen, by message id
	fetched atomic.Int64
	settled atomic.Int64
	maxOpen atomic.Int64
}

func newSettleLog() *settleLog {
	return &settleLog{acks: map[string]int{}, naks: map[string][]time.Duration{}, terms: map[string]int{}, deliv: map[string]int{}}
}

// Delivery is the highest delivery number of message id fetched so far.
func (l *settleLog) Delivery(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deliv[id]
}

// open is how many fetched deliveries are not settled yet.
func (l *settleLog) open() int64 { return l.fetched.Load() - l.settled.Load() }

// totalNaks counts every Nak call.
func (l *settleLog) totalNaks() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ds := range l.naks {
		n += len(ds)
	}
	return n
}

func (l *settleLog) Acks(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acks[id]
}

func (l *settleLog) Naks(id string) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.naks[id]...)
}

func (l *settleLog) Terms(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.terms[id]
}

// recSub wraps a subscriber and records every settle call.
type recSub struct {
	broker.Subscriber
	log *settleLog
}

func (s *recSub) Fetch(ctx context.Context, n int) ([]*broker.Message, error) {
	msgs, err := s.Subscriber.Fetch(ctx, n)
	for _, m := range msgs {
		s.log.mu.Lock()
		s.log.deliv[m.ID] = max(s.log.deliv[m.ID], m.Delivery)
		s.log.mu.Unlock()
		open := s.log.fetched.Add(1) - s.log.settled.Load()
		for {
			cur := s.log.maxOpen.Load()
			if open <= cur || s.log.maxOpen.CompareAndSwap(cur, open) {
				break
			}
		}
		m.Acker = &recAcker{Acker: m.Acker, id: m.ID, log: s.log}
	}
	return msgs, err
}

// MaxDeliveries forwards the inner subscriber's delivery limit.
func (s *recSub) MaxDeliveries() int {
	if dl, ok := s.Subscriber.(broker.DeliveryLimiter); ok {
		return dl.MaxDeliveries()
	}
	return 0
}

type recAcker struct {
	broker.Acker
	id   string
	log  *settleLog
	done atomic.Bool
}

func (a *recAcker) settle() {
	if a.done.CompareAndSwap(false, true) {
		a.log.settled.Add(1)
	}
}

func (a *recAcker) Ack(ctx context.Context) error {
	a.log.mu.Lock()
	a.log.acks[a.id]++
	a.log.mu.Unlock()
	a.settle()
	return a.Acker.Ack(ctx)
}

func (a *recAcker) Nak(ctx context.Context, d time.Duration) error {
	a.log.mu.Lock()
	a.log.naks[a.id] = append(a.log.naks[a.id], d)
	a.log.mu.Unlock()
	a.settle()
	return a.Acker.Nak(ctx, d)
}

func (a *recAcker) Term(ctx context.Context, reason string) error {
	a.log.mu.Lock()
	a.log.terms[a.id]++
	a.log.mu.Unlock()
	a.settle()
	return a.Acker.Term(ctx, reason)
}

// env is one test's broker, store, guard and settle log.
type env struct {
	t     *testing.T
	b     *membroker.Broker
	pub   *membroker.Publisher
	store idem.Store
	guard *idem.Guard
	log   *settleLog
	topic string
}

func newEnv(t *testing.T, guardOpts ...idem.Option) *env {
	t.Helper()
	return newEnvBroker(t, membroker.Config{AckWait: 5 * time.Second}, guardOpts...)
}

// newEnvBroker is newEnv with a broker configured by bc.
func newEnvBroker(t *testing.T, bc membroker.Config, guardOpts ...idem.Option) *env {
	t.Helper()
	b, err := membroker.New(bc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newEnvWith(t, b, st, guardOpts...)
}

func newEnvWith(t *testing.T, b *membroker.Broker, st idem.Store, guardOpts ...idem.Option) *env {
	g, err := idem.NewGuard(st, append([]idem.Option{idem.WithLease(2 * time.Second)}, guardOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return &env{t: t, b: b, pub: b.NewPublisher(), store: st, guard: g, log: newSettleLog(), topic: "orders"}
}

func (e *env) sub(group string) broker.Subscriber {
	return &recSub{Subscriber: e.b.NewSubscriber(e.topic, group), log: e.log}
}

func (e *env) publish(msgs ...*broker.Message) {
	e.t.Helper()
	for _, m := range msgs {
		if m.Topic == "" {
			m.Topic = e.topic
		}
	}
	if err := e.pub.Publish(context.Background(), msgs...); err != nil {
		e.t.Fatal(err)
	}
}

// config returns a Config with fast timings for tests.
func (e *env) config(sub broker.Subscriber) consumer.Config {
	return consumer.Config{
		Subscriber:       sub,
		Guard:            e.guard,
		Workers:          4,
		Backoff:          consumer.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
		InProcessMaxWait: 20 * time.Millisecond,
		StoreDownDelay:   50 * time.Millisecond,
		Batch:            consumer.BatchConfig{Wait: 5 * time.Millisecond},
	}
}

// run starts c and returns a stop func that shuts it down and returns
// Run's error.
func run(t *testing.T, c *consumer.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-errc
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// waitFor polls cond until it holds or the test's patience ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func msg(id, payload string) *broker.Message {
	return &broker.Message{ID: id, Payload: []byte(payload)}
}

// ledger counts effects per key, like a table without a unique constraint.
type ledger struct {
	mu    sync.Mutex
	n     map[string]int
	order map[string][]string
}

func newLedger() *ledger { return &ledger{n: map[string]int{}, order: map[string][]string{}} }

func (l *ledger) add(key, entry string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[key]++
	l.order[key] = append(l.order[key], entry)
}

func (l *ledger) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[key]
}

func (l *ledger) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := 0
	for _, n := range l.n {
		s += n
	}
	return s
}

// flakyStore fails every call with idem.ErrUnavailable while down is set.
type flakyStore struct {
	idem.Store
	down   atomic.Bool
	claims atomic.Int64 // claim calls (single or batch)
}

func (s *flakyStore) Claim(ctx context.Context, r idem.ClaimRequest) (idem.Claim, error) {
	s.claims.Add(1)
	if s.down.Load() {
		return idem.Claim{}, fmt.Errorf("%w: test outage", idem.ErrUnavailable)
	}
	return s.Store.Claim(ctx, r)
}

func (s *flakyStore) ClaimBatch(ctx context.Context, rs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	s.claims.Add(1)
	if s.down.Load() {
		return nil, fmt.Errorf("%w: test outage", idem.ErrUnavailable)
	}
	return s.Store.(idem.BatchClaimer).ClaimBatch(ctx, rs)
}

var errBoom = errors.New("boom")

// setEffect sets cfg's handler to run effect on each message: a Handler in
// mode "single", else a BatchHandler reporting the messages whose effect
// failed in a *consumer.PartialError.
func setEffect(cfg *consumer.Config, mode string, effect func(m *broker.Message) error) {
	if mode == "single" {
		cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return nil, effect(m) }
		return
	}
	cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
		failed := map[int]error{}
		for i, m := range ms {
			if err := effect(m); err != nil {
				failed[i] = err
			}
		}
		if len(failed) > 0 {
			return &consumer.PartialError{Failed: failed}
		}
		return nil
	}
}

func hasPrefix(s, p string) bool { return strings.HasPrefix(s, p) }
