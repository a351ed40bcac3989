package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

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
	cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
		failed := map[int]error{}
		for i, m := range ms {
			if strings.HasPrefix(m.ID, "bad") {
				failed[i] = errBoom
				continue
			}
			led.add(m.ID, "")
		}
		if len(failed) > 0 {
			return &consumer.PartialError{Failed: failed}
		}
		return nil
	}
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
