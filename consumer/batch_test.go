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
	"github.com/idem-dev/idem/consumer"
)

// countingStore counts ClaimBatch round trips.
type countingStore struct {
	idem.Store
	batches, claims atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, r idem.ClaimRequest) (idem.Claim, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, r)
}

func (s *countingStore) ClaimBatch(ctx context.Context, rs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	s.batches.Add(1)
	return s.Store.(idem.BatchClaimer).ClaimBatch(ctx, rs)
}

func TestBatchOneRoundTripAndDuplicatesInBatch(t *testing.T) {
	base := newEnv(t)
	cs := &countingStore{Store: base.store}
	e := newEnvWith(t, base.b, cs)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1
	cfg.Batch.Size = 100
	cfg.Batch.Wait = 50 * 1e6 // 50ms: the whole publish lands in one batch
	var sizes []int
	led := newLedger()
	cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
		sizes = append(sizes, len(ms))
		for _, m := range ms {
			led.add(m.ID, "")
		}
		return nil
	}
	var msgs []*broker.Message
	for i := range 50 {
		msgs = append(msgs, msg(fmt.Sprint(i), "x"))
	}
	// The same message twice in one batch: claimed once, both acked.
	msgs = append(msgs, msg("7", "x"))
	e.publish(msgs...)
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	waitFor(t, "all acked", func() bool { return e.log.Acks("7") == 2 && e.log.Acks("49") == 1 })
	stop()
	if cs.batches.Load() != 1 || cs.claims.Load() != 0 {
		t.Fatalf("%d batch claims, %d single claims; want 1 and 0", cs.batches.Load(), cs.claims.Load())
	}
	if len(sizes) != 1 || sizes[0] != 50 || led.total() != 50 {
		t.Fatalf("handler batches %v, ledger %d", sizes, led.total())
	}
}

func TestBatchPartialFailure(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1
	cfg.Batch.Wait = 20 * 1e6
	cfg.MaxAttempts = 2
	cfg.DeadLetter = e.b.NewPublisher()
	led := newLedger()
	setEffect(&cfg, "batch", func(m *broker.Message) error {
		if strings.HasPrefix(m.ID, "bad") {
			return errBoom
		}
		led.add(m.ID, "")
		return nil
	})
	e.publish(msg("a", "x"), msg("bad-1", "x"), msg("b", "x"))
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	waitFor(t, "settled", func() bool { return e.log.Acks("a") == 1 && e.log.Acks("b") == 1 && e.log.Terms("bad-1") == 1 })
	stop()
	if led.count("a") != 1 || led.count("b") != 1 {
		t.Fatal("good messages ran more than once")
	}
	if n := len(e.b.Published("orders.dead-letter")); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
}

func TestBatchWholeFailure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy consumer.BatchFailurePolicy
		fails  int64 // batch runs that fail before success
		dl     int
	}{
		{"retry then succeed", consumer.BatchRetry, 4, 0},
		{"retry until dead-letter", consumer.BatchRetry, 1 << 30, 3},
		{"dead-letter at once", consumer.BatchDeadLetter, 1 << 30, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.Workers = 1
			cfg.Batch.Wait = 20 * 1e6
			cfg.Batch.OnFailure = tc.policy
			cfg.MaxAttempts = 3
			cfg.InProcessRetries = 1
			cfg.DeadLetter = e.b.NewPublisher()
			var runs atomic.Int64
			led := newLedger()
			cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
				if runs.Add(1) <= tc.fails {
					return errBoom // a rolled-back transaction: nothing done
				}
				for _, m := range ms {
					led.add(m.ID, "")
				}
				return nil
			}
			e.publish(msg("a", "x"), msg("b", "x"), msg("c", "x"))
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			waitFor(t, "settled", func() bool {
				for _, id := range []string{"a", "b", "c"} {
					if e.log.Acks(id)+e.log.Terms(id) == 0 {
						return false
					}
				}
				return true
			})
			stop()
			if got := len(e.b.Published("orders.dead-letter")); got != tc.dl {
				t.Fatalf("%d dead letters, want %d", got, tc.dl)
			}
			if tc.dl == 0 && led.total() != 3 {
				t.Fatalf("ledger has %d entries, want 3", led.total())
			}
			if tc.policy == consumer.BatchDeadLetter && runs.Load() != 2 {
				t.Fatalf("batch ran %d times, want 2 (1 + 1 in-process retry)", runs.Load())
			}
		})
	}
}

func TestBatchGroupBy(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1
	cfg.Batch.Wait = 20 * 1e6
	cfg.Batch.GroupBy = func(m *broker.Message) string { return string(m.Key) }
	groups := map[string]int{}
	cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
		for _, m := range ms {
			if string(m.Key) != string(ms[0].Key) {
				return fmt.Errorf("mixed group")
			}
		}
		groups[string(ms[0].Key)] += len(ms)
		if string(ms[0].Key) == "acct-bad" {
			return errBoom
		}
		return nil
	}
	var msgs []*broker.Message
	for i := range 9 {
		m := msg(fmt.Sprint(i), "x")
		m.Key = []byte([]string{"acct-1", "acct-2", "acct-bad"}[i%3])
		msgs = append(msgs, m)
	}
	e.publish(msgs...)
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	waitFor(t, "good groups acked", func() bool { return c.Stats().Handled == 6 })
	stop()
	if groups["acct-1"] < 3 || groups["acct-2"] < 3 {
		t.Fatalf("groups %v", groups)
	}
	for i := 2; i < 9; i += 3 {
		if e.log.Acks(fmt.Sprint(i)) != 0 {
			t.Fatal("message of the failing group acked")
		}
	}
}

// TestBatchMessageTokens (issue 11.11): a batch handler gets each
// message's fencing token through MessageToken; single mode too.
func TestBatchMessageTokens(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.Workers = 1
			cfg.Batch.Wait = 20 * time.Millisecond
			var mu sync.Mutex
			got := map[string]uint64{}
			check := func(ctx context.Context, m *broker.Message) {
				tok, ok := consumer.MessageToken(ctx, m)
				if !ok || tok == 0 {
					t.Errorf("no token for %s", m.ID)
				}
				if _, ok := consumer.MessageToken(ctx, msg("stranger", "x")); ok {
					t.Error("a token for a message the handler was not given")
				}
				mu.Lock()
				got[m.ID] = tok
				mu.Unlock()
			}
			if mode == "batch" {
				cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
					for _, m := range ms {
						check(ctx, m)
					}
					return nil
				}
			} else {
				cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
					check(ctx, m)
					if tok, _ := consumer.TokenFromContext(ctx); tok != got[m.ID] {
						t.Errorf("TokenFromContext %d, MessageToken %d", tok, got[m.ID])
					}
					return nil, nil
				}
			}
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			e.publish(msg("a", "x"), msg("b", "x"), msg("c", "x"))
			waitFor(t, "acks", func() bool { return c.Stats().Handled == 3 })
			stop()
			for _, id := range []string{"a", "b", "c"} {
				rec, err := e.store.Get(context.Background(), []byte(id))
				if err != nil || rec.Token != got[id] {
					t.Fatalf("%s: record token %d (%v), handler saw %d", id, rec.Token, err, got[id])
				}
			}
			if _, ok := consumer.MessageToken(context.Background(), msg("a", "x")); ok {
				t.Fatal("a token outside a handler")
			}
		})
	}
}

// TestBatchLeaseLossCancelsHandler (issue 11.11): when one message's claim
// is lost while the batch handler runs, the handler's context is cancelled
// with ErrLeaseLost naming it; that message is nak'ed (never acked) and
// the handler runs again at once on the others, whose claims are intact.
func TestBatchLeaseLossCancelsHandler(t *testing.T) {
	e := newEnv(t)
	g, err := idem.NewGuard(e.store, idem.WithLease(200*time.Millisecond), idem.WithHeartbeat(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	cfg := e.config(e.sub("g"))
	cfg.Guard = g
	cfg.Workers = 1
	cfg.Batch.Wait = 50 * time.Millisecond
	cause := make(chan error, 1)
	var mu sync.Mutex
	var calls [][]string
	led := newLedger()
	cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		mu.Lock()
		calls = append(calls, ids)
		first := len(calls) == 1
		mu.Unlock()
		if first {
			// An operator deletes b's record while the batch runs.
			if err := e.store.Delete(context.Background(), []byte("b")); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				cause <- context.Cause(ctx)
				return ctx.Err() // the transaction rolled back
			case <-time.After(10 * time.Second):
				cause <- nil
				return nil
			}
		}
		for _, m := range ms {
			led.add(m.ID, "")
		}
		return nil
	}
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("a", "x"), msg("b", "x"), msg("c", "x"))
	err = <-cause
	if !errors.Is(err, idem.ErrLeaseLost) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("batch context cause = %v, want ErrLeaseLost naming b", err)
	}
	waitFor(t, "all three done", func() bool { return led.count("a") == 1 && led.count("b") == 1 && led.count("c") == 1 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 2 || fmt.Sprint(calls[1]) != "[a c]" {
		t.Fatalf("handler calls %v, want the second on [a c]", calls)
	}
	if len(e.log.Naks("b")) == 0 || e.log.Acks("b") != 1 {
		t.Fatalf("b: naks %v, acks %d; want nak'ed after losing its claim, then handled", e.log.Naks("b"), e.log.Acks("b"))
	}
	for _, id := range []string{"a", "c"} {
		rec, err := e.store.Get(context.Background(), []byte(id))
		if err != nil || rec.Attempts != 1 || len(e.log.Naks(id)) != 0 {
			t.Fatalf("%s: record %+v (%v), naks %v; want done on its first claim", id, rec, err, e.log.Naks(id))
		}
	}
}
