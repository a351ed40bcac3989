package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// TestExactlyOnce: duplicate publishes, forced naks after the effect and a
// consumer that is replaced mid-run; every message's effect happens once.
func TestExactlyOnce(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			const n = 2000
			var msgs []*broker.Message
			for i := range n {
				msgs = append(msgs, msg(fmt.Sprintf("m-%d", i), fmt.Sprintf(`{"i":%d}`, i)))
			}
			// 20% duplicate publishes of the same message.
			rng := rand.New(rand.NewPCG(1, 2))
			for range n / 5 {
				m := msgs[rng.IntN(n)]
				msgs = append(msgs, msg(m.ID, string(m.Payload)))
			}
			rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
			e.publish(msgs...)

			led := newLedger()
			var forced atomic.Int64
			handler := func(ctx context.Context, m *broker.Message) ([]byte, error) {
				led.add(m.ID, "")
				return nil, nil
			}
			batchHandler := func(ctx context.Context, ms []*broker.Message) error {
				for _, m := range ms {
					led.add(m.ID, "")
				}
				return nil
			}
			newConsumer := func() *consumer.Consumer {
				sub := &nakSomeSub{Subscriber: e.sub("g"), every: 10, forced: &forced}
				cfg := e.config(sub)
				if mode == "batch" {
					cfg.BatchHandler = batchHandler
				} else {
					cfg.Handler = handler
				}
				c, err := consumer.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			c1 := newConsumer()
			stop1 := run(t, c1)
			waitFor(t, "a quarter of the work", func() bool { return led.total() >= n/4 })
			// Replace the consumer mid-run: the second one takes over
			// whatever the first left.
			if err := stop1(); err != nil {
				t.Fatal(err)
			}
			c2 := newConsumer()
			stop2 := run(t, c2)
			waitFor(t, "every message once", func() bool {
				for i := range n {
					if led.count(fmt.Sprintf("m-%d", i)) == 0 {
						return false
					}
				}
				return true
			})
			if err := stop2(); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if got := led.count(fmt.Sprintf("m-%d", i)); got != 1 {
					t.Fatalf("message m-%d took effect %d times", i, got)
				}
			}
			if forced.Load() == 0 {
				t.Fatal("no forced redelivery happened")
			}
			st := c1.Stats()
			st2 := c2.Stats()
			if st.Duplicates+st2.Duplicates == 0 {
				t.Fatal("no duplicate was recognised")
			}
		})
	}
}

// nakSomeSub turns every n-th Ack into a Nak: the effect is done but the
// broker redelivers (a lost ack).
type nakSomeSub struct {
	broker.Subscriber
	every  int64
	n      atomic.Int64
	forced *atomic.Int64
}

func (s *nakSomeSub) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	msgs, err := s.Subscriber.Fetch(ctx, max)
	for _, m := range msgs {
		if m.Delivery == 1 && s.n.Add(1)%s.every == 0 {
			m.Acker = &ackIsNak{Acker: m.Acker, forced: s.forced}
		}
	}
	return msgs, err
}

type ackIsNak struct {
	broker.Acker
	forced *atomic.Int64
}

func (a *ackIsNak) Ack(ctx context.Context) error {
	a.forced.Add(1)
	return a.Acker.Nak(ctx, 0)
}

func TestDuplicateOfInProgressIsNakedNotAcked(t *testing.T) {
	e := newEnv(t)
	// Another worker holds the key.
	held, _, err := e.guard.Acquire(context.Background(), []byte("m-1"), idem.WithFingerprint(idem.FingerprintOf([]byte("p"))))
	if err != nil {
		t.Fatal(err)
	}
	ran := atomic.Int64{}
	cfg := e.config(e.sub("g"))
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { ran.Add(1); return nil, nil }
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("m-1", "p"))
	waitFor(t, "a nak", func() bool { return len(e.log.Naks("m-1")) > 0 })
	if e.log.Acks("m-1") != 0 || ran.Load() != 0 {
		t.Fatal("a duplicate of work in progress was acked or run")
	}
	if d := e.log.Naks("m-1")[0]; d <= 0 || d > 2*time.Second {
		t.Fatalf("nak delay %s, want the holder's remaining lease (<= 2s)", d)
	}
	// The holder completes; the redelivery is acked as a duplicate.
	if err := held.Complete(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ack after completion", func() bool { return e.log.Acks("m-1") == 1 })
	stop()
	if ran.Load() != 0 {
		t.Fatal("handler ran for a key completed elsewhere")
	}
}

func TestPoisonDeadLetteredOnce(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.MaxAttempts = 3
	cfg.InProcessRetries = 1
	cfg.DeadLetter = e.b.NewPublisher()
	var runs atomic.Int64
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		runs.Add(1)
		return nil, errBoom
	}
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("poison", "x"))
	waitFor(t, "the term", func() bool { return e.log.Terms("poison") == 1 })
	// A duplicate of the poison message later: no second dead letter.
	e.publish(msg("poison", "x"))
	waitFor(t, "the duplicate's term", func() bool { return e.log.Terms("poison") == 2 })
	stop()
	dl := e.b.Published("orders.dead-letter")
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	if dl[0].Headers[consumer.HeaderOriginalID] != "poison" || dl[0].Headers[consumer.HeaderDeadLetterReason] == "" {
		t.Fatalf("dead letter headers: %v", dl[0].Headers)
	}
	// 3 claims, each with 1 in-process retry.
	if got := runs.Load(); got != 6 {
		t.Fatalf("handler ran %d times, want 6 (3 attempts x 2 runs)", got)
	}
	if e.log.Acks("poison") != 0 {
		t.Fatal("poison message acked")
	}
}

func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.DeadLetter = e.b.NewPublisher()
	var runs atomic.Int64
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		runs.Add(1)
		return nil, idem.Permanent(errBoom)
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("bad", "x"))
	waitFor(t, "the term", func() bool { return e.log.Terms("bad") == 1 })
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
}

func TestInProcessRetrySucceeds(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	var runs atomic.Int64
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		if runs.Add(1) < 3 {
			return nil, errBoom
		}
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("flaky", "x"))
	waitFor(t, "the ack", func() bool { return e.log.Acks("flaky") == 1 })
	if n := len(e.log.Naks("flaky")); n != 0 {
		t.Fatalf("%d naks; short retries should stay in process", n)
	}
}

func TestLongBackoffGoesToBroker(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Backoff = consumer.Backoff{Initial: 30 * time.Millisecond, Max: 100 * time.Millisecond}
	cfg.InProcessMaxWait = 10 * time.Millisecond // every backoff is "long"
	var runs atomic.Int64
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		if runs.Add(1) == 1 {
			return nil, errBoom
		}
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("slow", "x"))
	waitFor(t, "the ack", func() bool { return e.log.Acks("slow") == 1 })
	naks := e.log.Naks("slow")
	if len(naks) != 1 || naks[0] < 30*time.Millisecond {
		t.Fatalf("naks %v, want one with the backoff delay", naks)
	}
}

// TestStoreDownFailsClosed: while the store is down nothing runs and
// nothing is acked, and nothing is nak'ed either (each nak would spend one
// of the broker's deliveries): the message is held until the store
// answers, then handled once.
func TestStoreDownFailsClosed(t *testing.T) {
	e := newEnv(t)
	fs := &flakyStore{Store: e.store}
	fs.down.Store(true)
	g, err := idem.NewGuard(fs, idem.WithLease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			fs.down.Store(true)
			e.topic = "t-" + mode
			cfg := e.config(e.sub("g"))
			cfg.Guard = g
			var runs atomic.Int64
			if mode == "batch" {
				cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error { runs.Add(int64(len(ms))); return nil }
			} else {
				cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { runs.Add(1); return nil, nil }
			}
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			id := "down-" + mode
			e.publish(msg(id, "x"))
			before := fs.claims.Load()
			waitFor(t, "claims retried while down", func() bool { return fs.claims.Load() >= before+3 && c.Stats().HeldNow == 1 })
			if runs.Load() != 0 || e.log.Acks(id) != 0 || len(e.log.Naks(id)) != 0 {
				t.Fatalf("ran %d, acked %d, nak'ed %v while the store was down", runs.Load(), e.log.Acks(id), e.log.Naks(id))
			}
			if st := c.Stats(); st.HeldNow != 1 || st.Holds != 1 {
				t.Fatalf("stats while down %+v, want 1 held", st)
			}
			fs.down.Store(false)
			waitFor(t, "the ack after recovery", func() bool { return e.log.Acks(id) == 1 })
			stop()
			if st := c.Stats(); runs.Load() != 1 || st.StoreErrors == 0 || st.HeldNow != 0 || len(e.log.Naks(id)) != 0 {
				t.Fatalf("runs %d, stats %+v, naks %v", runs.Load(), st, e.log.Naks(id))
			}
		})
	}
}

func TestMissingKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy consumer.MissingKeyPolicy
		dl     int
	}{{"dead-letter", consumer.MissingKeyDeadLetter, 1}, {"reject", consumer.MissingKeyReject, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.Key = consumer.JSONBusinessKey("order_id", "op")
			cfg.MissingKey = tc.policy
			cfg.DeadLetter = e.b.NewPublisher()
			var runs atomic.Int64
			cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { runs.Add(1); return nil, nil }
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			e.publish(msg("nokey", `{"op":"pay"}`), msg("ok", `{"op":"pay","order_id":7}`))
			waitFor(t, "settled", func() bool { return e.log.Terms("nokey") == 1 && e.log.Acks("ok") == 1 })
			stop()
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1 (only the keyed message)", runs.Load())
			}
			if got := len(e.b.Published("orders.dead-letter")); got != tc.dl {
				t.Fatalf("%d dead letters, want %d", got, tc.dl)
			}
		})
	}
}

func TestFingerprintMismatchDeadLetters(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.DeadLetter = e.b.NewPublisher()
	led := newLedger()
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		led.add(m.ID, string(m.Payload))
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("k", "first"))
	waitFor(t, "first ack", func() bool { return e.log.Acks("k") == 1 })
	e.publish(msg("k", "another payload"))
	waitFor(t, "term", func() bool { return e.log.Terms("k") == 1 })
	if led.count("k") != 1 {
		t.Fatal("reused key ran again")
	}
}

func TestPerKeyOrdering(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 8
	led := newLedger()
	var running, maxRunning atomic.Int64
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		r := running.Add(1)
		defer running.Add(-1)
		for {
			cur := maxRunning.Load()
			if r <= cur || maxRunning.CompareAndSwap(cur, r) {
				break
			}
		}
		time.Sleep(100 * time.Microsecond)
		led.add(string(m.Key), m.ID)
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	const keys, per = 16, 50
	var want [keys][]string
	var msgs []*broker.Message
	for i := range per {
		for k := range keys {
			m := msg(fmt.Sprintf("k%d-%d", k, i), "x")
			m.Key = fmt.Appendf(nil, "account-%d", k)
			msgs = append(msgs, m)
			want[k] = append(want[k], m.ID)
		}
	}
	e.publish(msgs...)
	stop := run(t, c)
	waitFor(t, "all handled", func() bool { return led.total() == keys*per })
	stop()
	for k := range keys {
		led.mu.Lock()
		got := led.order[fmt.Sprintf("account-%d", k)]
		led.mu.Unlock()
		if !slices.Equal(got, want[k]) {
			t.Fatalf("key %d handled out of order", k)
		}
	}
	t.Logf("max concurrent handlers: %d", maxRunning.Load())
}

func TestBackpressure(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.MaxInFlight = 8
	cfg.FetchBatch = 4
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		time.Sleep(time.Millisecond)
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	var msgs []*broker.Message
	for i := range 200 {
		msgs = append(msgs, msg(fmt.Sprint(i), "x"))
	}
	e.publish(msgs...)
	stop := run(t, c)
	waitFor(t, "all acked", func() bool { return c.Stats().Handled == 200 })
	stop()
	if got := e.log.maxOpen.Load(); got > 8 {
		t.Fatalf("%d messages fetched and unsettled at once, bound is 8", got)
	}
}

// TestGracefulShutdown: a handler running when Run's context ends finishes
// and its message is acked; Run returns only then.
func TestGracefulShutdown(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	started := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		once.Do(func() { close(started) })
		<-release
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	e.publish(msg("slow", "x"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	cancel()
	select {
	case <-done:
		t.Fatal("Run returned before the running handler finished")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if e.log.Acks("slow") != 1 {
		t.Fatal("finished message not acked on shutdown")
	}
}

func TestShutdownTimeoutNaksTheRest(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1
	cfg.ShutdownTimeout = 20 * time.Millisecond
	started := make(chan struct{}, 10)
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		started <- struct{}{}
		time.Sleep(100 * time.Millisecond)
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	e.publish(msg("a", "x"), msg("b", "x"), msg("c", "x"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	cancel()
	<-done
	// a finished (acked); the ones queued behind it were nak'ed, not run.
	if e.log.Acks("a") != 1 || len(e.log.Naks("c")) != 1 || e.log.Acks("c") != 0 {
		t.Fatalf("acks a=%d, naks c=%v", e.log.Acks("a"), e.log.Naks("c"))
	}
}

func TestTraceContext(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	got := make(chan broker.TraceContext, 2)
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		tc, _ := broker.TraceFromContext(ctx)
		got <- tc
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m := msg("traced", "x")
	m.Headers = map[string]string{broker.HeaderTraceParent: tp, broker.HeaderTraceState: "a=b"}
	e.publish(m)
	tc := <-got
	if tc.TraceParent != tp || tc.TraceState != "a=b" || tc.TraceID() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace context %+v", tc)
	}
	bad := msg("badtrace", "x")
	bad.Headers = map[string]string{broker.HeaderTraceParent: "garbage"}
	e.publish(bad)
	if tc := <-got; tc.TraceParent != "" {
		t.Fatalf("invalid traceparent accepted: %+v", tc)
	}
}

func TestHandlerPanicIsAFailure(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	var runs atomic.Int64
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		if runs.Add(1) == 1 {
			panic("oops")
		}
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("p", "x"))
	waitFor(t, "ack", func() bool { return e.log.Acks("p") == 1 })
}

func TestInProgressHeartbeat(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.InProgressInterval = 5 * time.Millisecond
	var beats atomic.Int64
	cfg.Subscriber = &countInProgressSub{Subscriber: cfg.Subscriber, n: &beats}
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		time.Sleep(60 * time.Millisecond)
		return nil, nil
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("long", "x"))
	waitFor(t, "ack", func() bool { return e.log.Acks("long") == 1 })
	if beats.Load() == 0 {
		t.Fatal("no InProgress heartbeat during a long handler")
	}
}

type countInProgressSub struct {
	broker.Subscriber
	n *atomic.Int64
}

func (s *countInProgressSub) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	msgs, err := s.Subscriber.Fetch(ctx, max)
	for _, m := range msgs {
		m.Acker = &countInProgress{Acker: m.Acker, n: s.n}
	}
	return msgs, err
}

type countInProgress struct {
	broker.Acker
	n *atomic.Int64
}

func (a *countInProgress) InProgress(ctx context.Context) error {
	a.n.Add(1)
	return a.Acker.InProgress(ctx)
}

func TestClosedSubscriberEndsRun(t *testing.T) {
	e := newEnv(t)
	sub := e.sub("g")
	cfg := e.config(sub)
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return nil, nil }
	c, _ := consumer.New(cfg)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	time.Sleep(10 * time.Millisecond)
	sub.Close()
	if err := <-done; !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Run = %v, want broker.ErrClosed", err)
	}
	if err := c.Run(context.Background()); err == nil {
		t.Fatal("second Run accepted")
	}
}

func TestOversizedResultDeadLetters(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.DeadLetter = e.b.NewPublisher()
	var runs atomic.Int64
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		runs.Add(1)
		return make([]byte, idem.MaxResultLen+1), nil
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("big", "x"))
	waitFor(t, "term", func() bool { return e.log.Terms("big") == 1 })
	if runs.Load() != 1 || len(e.b.Published("orders.dead-letter")) != 1 {
		t.Fatalf("runs %d, dead letters %d", runs.Load(), len(e.b.Published("orders.dead-letter")))
	}
}

func TestKeyFuncPanicTakesMissingKeyPath(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.MissingKey = consumer.MissingKeyReject
	cfg.Key = func(m *broker.Message) ([]byte, error) {
		if m.ID == "boom" {
			panic("bad key func")
		}
		return []byte(m.ID), nil
	}
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return nil, nil }
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("boom", "x"), msg("fine", "x"))
	waitFor(t, "settled", func() bool { return e.log.Terms("boom") == 1 && e.log.Acks("fine") == 1 })
}

// TestLeaseLostNotAcked (F3): the handler outlives its lease (heartbeat
// off), a duplicate on another consumer takes the key over and completes;
// the first worker's completion is fenced, so its delivery is nak'ed, not
// acked.
func TestLeaseLostNotAcked(t *testing.T) {
	e := newEnv(t)
	g, err := idem.NewGuard(e.store, idem.WithLease(50*time.Millisecond), idem.WithHeartbeat(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	first := make(chan struct{})
	var runs atomic.Int64
	handler := func(ctx context.Context, m *broker.Message) ([]byte, error) {
		if runs.Add(1) == 1 {
			close(first)
			time.Sleep(time.Second) // well past the lease
		}
		return nil, nil
	}
	for _, topic := range []string{"a", "b"} {
		e.topic = topic
		cfg := e.config(e.sub("g"))
		cfg.Guard = g
		cfg.InProgressInterval = -1
		cfg.Handler = handler
		c, _ := consumer.New(cfg)
		run(t, c)
	}
	e.publish(&broker.Message{ID: "k", Topic: "a", Payload: []byte("x")})
	<-first
	time.Sleep(100 * time.Millisecond) // the lease has expired
	e.publish(&broker.Message{ID: "k", Topic: "b", Payload: []byte("x")})
	waitFor(t, "one ack and one nak", func() bool { return e.log.Acks("k") >= 1 && len(e.log.Naks("k")) >= 1 })
	rec, err := e.store.Get(context.Background(), []byte("k"))
	if err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("record %+v, %v", rec, err)
	}
}

// TestStoreDownPausesFetching: once the store is seen down the consumer
// holds what it fetched and stops fetching for StoreDownDelay, instead of
// fetching the backlog only to hold it too; the first claim that succeeds
// ends the pause.
func TestStoreDownPausesFetching(t *testing.T) {
	e := newEnv(t)
	fs := &flakyStore{Store: e.store}
	fs.down.Store(true)
	g, err := idem.NewGuard(fs)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// Fetching is faster than a claim: let the second fetch wait until
	// the first claim has failed, so the pause is in place for the third.
	var cp atomic.Pointer[consumer.Consumer]
	sub := &slowSecondFetch{Subscriber: e.sub("g"), ready: func() bool { c := cp.Load(); return c != nil && c.Stats().StoreErrors > 0 }}
	cfg := e.config(sub)
	cfg.Guard = g
	cfg.StoreDownDelay = time.Hour
	cfg.FetchBatch = 1
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return nil, nil }
	const n = 100
	var msgs []*broker.Message
	for i := range n {
		msgs = append(msgs, msg(fmt.Sprint(i), "x"))
	}
	e.publish(msgs...)
	c, _ := consumer.New(cfg)
	cp.Store(c)
	stop := run(t, c)
	waitFor(t, "the first holds", func() bool { return c.Stats().HeldNow > 0 })
	time.Sleep(50 * time.Millisecond)
	if got := e.log.fetched.Load(); got > 2 {
		t.Fatalf("fetched %d of %d messages while the store was down, want 2 at most", got, n)
	}
	fs.down.Store(false)
	waitFor(t, "everything after recovery", func() bool { return c.Stats().Handled == n })
	stop()
	if naks := e.log.totalNaks(); naks != 0 {
		t.Fatalf("%d naks", naks)
	}
}

// slowSecondFetch makes the second Fetch wait until ready, then fetch.
// (A store failure sets the fetch pause before it counts in StoreErrors.)
type slowSecondFetch struct {
	broker.Subscriber
	calls atomic.Int64
	ready func() bool
}

func (s *slowSecondFetch) Fetch(ctx context.Context, n int) ([]*broker.Message, error) {
	if s.calls.Add(1) == 2 {
		for !s.ready() && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}
	return s.Subscriber.Fetch(ctx, n)
}

func TestWarnsWhenTTLShorterThanRedeliveryWindow(t *testing.T) {
	e := newEnv(t)
	var buf syncBuffer
	g, err := idem.NewGuard(e.store, idem.WithTTL(time.Minute), idem.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	cfg := e.config(windowSub{Subscriber: e.sub("g"), w: time.Hour})
	cfg.Guard = g
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return nil, nil }
	if _, err := consumer.New(cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "redelivery") {
		t.Fatalf("no warning logged: %q", buf.String())
	}
}

type windowSub struct {
	broker.Subscriber
	w time.Duration
}

func (s windowSub) RedeliveryWindow() time.Duration { return s.w }

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLeaseLossCancelsHandler: when the guard's heartbeat finds the claim
// gone, the running handler's context is cancelled with ErrLeaseLost and
// the delivery is nak'ed, not acked.
func TestLeaseLossCancelsHandler(t *testing.T) {
	e := newEnv(t)
	g, err := idem.NewGuard(e.store, idem.WithLease(200*time.Millisecond), idem.WithHeartbeat(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	cfg := e.config(e.sub("g"))
	cfg.Guard = g
	cause := make(chan error, 1)
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		if m.Delivery > 1 {
			return nil, nil
		}
		// An operator deletes the record while the handler runs.
		if err := e.store.Delete(context.Background(), []byte(m.ID)); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			cause <- context.Cause(ctx)
			return nil, ctx.Err()
		case <-time.After(10 * time.Second):
			cause <- nil
			return nil, nil
		}
	}
	c, _ := consumer.New(cfg)
	run(t, c)
	e.publish(msg("lost", "x"))
	if err := <-cause; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("handler context cause = %v, want ErrLeaseLost", err)
	}
	waitFor(t, "the nak", func() bool { return len(e.log.Naks("lost")) >= 1 })
	if e.log.Acks("lost") > 0 && len(e.log.Naks("lost")) == 0 {
		t.Fatal("acked a delivery whose claim was lost")
	}
}
