package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// dialRefused is what a driver returns when its database is down: no
// idem sentinel anywhere in it.
func dialRefused() error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

// errDriverDown stands for a driver error only the store's classifier
// knows (a SQLSTATE class, say).
var errDriverDown = errors.New("driver: 57P01 admin shutdown")

// classifyingStore is a store whose driver errors it classifies itself.
type classifyingStore struct{ idem.Store }

func (s classifyingStore) ClassifyError(err error) error {
	if errors.Is(err, errDriverDown) {
		return fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
	}
	return idem.ClassifyError(err)
}

func (s classifyingStore) ClaimBatch(ctx context.Context, rs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	return s.Store.(idem.BatchClaimer).ClaimBatch(ctx, rs)
}

func (s classifyingStore) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	return s.Store.(idem.BatchCompleter).CompleteBatch(ctx, cs)
}

// errOtherSystemDown stands for an error of a system only the user knows.
var errOtherSystemDown = errors.New("payments api: 503")

// TestHandlerUnavailableSpendsNoAttempt (issue 11.3): a handler whose
// database (or other system) is down returns the driver's error as is;
// the runtime classifies it (idem.ClassifyError, the store's
// ErrorClassifier, Config.ClassifyError) and holds the message, keeping
// its claim, for many times MaxAttempts handler runs: no attempt is
// spent, nothing is nak'ed or dead-lettered, and once the system is back
// the message takes effect once. In every mode.
func TestHandlerUnavailableSpendsNoAttempt(t *testing.T) {
	for _, kind := range []struct {
		name string
		err  func() error
	}{
		{"dial refused", dialRefused},
		{"store classifier", func() error { return errDriverDown }},
		{"config classifier", func() error { return errOtherSystemDown }},
	} {
		for _, mode := range []string{"single", "batch", "tx", "txbatch", "steps"} {
			t.Run(kind.name+"/"+mode, func(t *testing.T) {
				base := newEnv(t)
				e := newEnvWith(t, base.b, classifyingStore{base.store})
				cfg := e.config(e.sub("g"))
				cfg.MaxAttempts = 3
				cfg.DeadLetter = e.b.NewPublisher()
				cfg.ClassifyError = func(err error) error {
					if errors.Is(err, errOtherSystemDown) {
						return fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
					}
					return err
				}
				const outageRuns = 12 // handler runs that fail: many times MaxAttempts
				var runs atomic.Int64
				down := func() error {
					if runs.Add(1) <= outageRuns {
						return kind.err()
					}
					return nil
				}
				led := newLedger()
				switch mode {
				case "single":
					cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
						if err := down(); err != nil {
							return nil, err
						}
						led.add(m.ID, "")
						return nil, nil
					}
				case "batch":
					cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error {
						if err := down(); err != nil {
							return err
						}
						for _, m := range ms {
							led.add(m.ID, "")
						}
						return nil
					}
				case "tx":
					tx := storeTx(base.store, led)
					cfg.TxHandler = func(ctx context.Context, it consumer.TxItem) (consumer.TxOutcome, error) {
						if err := down(); err != nil {
							return consumer.TxOutcome{}, err // rolled back
						}
						outs, err := tx(ctx, []consumer.TxItem{it})
						if err != nil {
							return consumer.TxOutcome{}, err
						}
						return outs[0], nil
					}
				case "txbatch":
					tx := storeTx(base.store, led)
					cfg.TxBatchHandler = func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
						if err := down(); err != nil {
							return nil, err
						}
						return tx(ctx, items)
					}
				case "steps":
					h, err := consumer.Steps(e.guard,
						consumer.Step{Name: "reserve", Run: func(ctx context.Context, m *broker.Message, _ map[string][]byte) ([]byte, error) {
							led.add(m.ID+"/reserve", "")
							return nil, nil
						}},
						consumer.Step{Name: "charge", Run: func(ctx context.Context, m *broker.Message, _ map[string][]byte) ([]byte, error) {
							if err := down(); err != nil {
								return nil, err
							}
							led.add(m.ID, "")
							return nil, nil
						}})
					if err != nil {
						t.Fatal(err)
					}
					cfg.Handler = h
				}
				c, err := consumer.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				stop := run(t, c)
				e.publish(msg("a", "x"))
				waitFor(t, "a settled", func() bool { return e.log.Acks("a")+e.log.Terms("a") > 0 })
				stop()
				if runs.Load() <= outageRuns {
					t.Fatalf("the handler ran %d times; the outage lasted %d runs", runs.Load(), outageRuns)
				}
				if e.log.Acks("a") != 1 || led.count("a") != 1 {
					t.Fatalf("acks %d, effects %d; want 1 and 1", e.log.Acks("a"), led.count("a"))
				}
				if n := len(e.b.Published("orders.dead-letter")); n != 0 || len(e.log.Naks("a")) != 0 {
					t.Fatalf("%d dead letters, naks %v: the outage spent attempts", n, e.log.Naks("a"))
				}
				keys := []string{"a"}
				if mode == "steps" {
					keys = append(keys, "a/step:charge")
					if led.count("a/reserve") != 1 {
						t.Fatalf("step reserve ran %d times", led.count("a/reserve"))
					}
				}
				for _, k := range keys {
					rec, err := e.store.Get(context.Background(), []byte(k))
					if err != nil || rec.Attempts != 1 || rec.State != idem.StateCompleted {
						t.Fatalf("record %s: %+v, %v; want completed after 1 attempt", k, rec, err)
					}
				}
				if st := c.Stats(); st.Holds == 0 {
					t.Fatalf("stats %+v: no hold counted", st)
				}
			})
		}
	}
}
