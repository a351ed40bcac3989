package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
)

// TestCrashLoopDeadLettered: a message whose handler kills its process
// (an OOM kill, a segfault in a C library, os.Exit) never returns an
// error, so its claims are never released: each redelivery takes the key
// over after the lease and runs it again. Config.MaxAttempts says a key
// gets that many claims "that ran the handler" before it is dead-lettered;
// once MaxAttempts processes have died on it, the next claim must
// dead-letter it without running it. Otherwise the crash loop goes on
// until the broker's delivery limit, where JetStream (and membroker)
// silently drop it: never applied, never dead-lettered. Each crash here is
// a consumer whose guard stops (no more heartbeats) and whose subscriber
// closes (membroker redelivers at once) while its handler is stuck.
func TestCrashLoopDeadLettered(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			b, err := membroker.New(membroker.Config{AckWait: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			st, err := memstore.New(memstore.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			pub := b.NewPublisher()
			if err := pub.Publish(context.Background(), &broker.Message{ID: "poison", Topic: "orders", Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			stuck := make(chan struct{}) // the crashed processes' handlers never return before the test ends
			var runs atomic.Int64
			newConsumer := func(g *idem.Guard, sub broker.Subscriber, running chan<- struct{}) *consumer.Consumer {
				cfg := consumer.Config{
					Subscriber: sub, Guard: g, Workers: 1, DeadLetter: b.NewPublisher(),
					Backoff:        consumer.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
					StoreDownDelay: 50 * time.Millisecond,
					Batch:          consumer.BatchConfig{Wait: time.Millisecond},
				}
				effect := func() error {
					runs.Add(1)
					select { // a crashed process's handler runs again only once the test ends
					case running <- struct{}{}:
					default:
					}
					<-stuck
					return errBoom
				}
				if mode == "single" {
					cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return nil, effect() }
				} else {
					cfg.BatchHandler = func(ctx context.Context, ms []*broker.Message) error { return effect() }
				}
				c, err := consumer.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			const maxAttempts = 5 // consumer.Config's default
			var dead []func() error
			for i := 0; i < maxAttempts; i++ {
				g, err := idem.NewGuard(st, idem.WithLease(100*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				sub := b.NewSubscriber("orders", "g")
				running := make(chan struct{}, 1)
				dead = append(dead, run(t, newConsumer(g, sub, running)))
				<-running // the handler runs: now the process dies
				g.Close()
				sub.Close()
			}
			if got := runs.Load(); got != maxAttempts {
				t.Fatalf("handler ran %d times before the survivor started, want %d", got, maxAttempts)
			}
			rec, err := st.Get(context.Background(), []byte("poison"))
			if err != nil || rec.Attempts != maxAttempts || rec.State != idem.StateInProgress {
				t.Fatalf("record after %d crashes: %+v, %v", maxAttempts, rec, err)
			}

			// A healthy process with default MaxAttempts takes over.
			g, err := idem.NewGuard(st, idem.WithLease(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Close() })
			sub := b.NewSubscriber("orders", "g")
			done := make(chan struct{})
			go func() {
				for {
					if len(b.Published("orders.dead-letter")) > 0 || runs.Load() > maxAttempts {
						close(done)
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
			stop := run(t, newConsumer(g, sub, make(chan struct{}, 1)))
			<-done
			if got := runs.Load(); got != maxAttempts {
				t.Errorf("the handler ran again (run %d) after %d claims died running it; want it dead-lettered without running", got, maxAttempts)
			}
			close(stuck)
			stop()
			for _, s := range dead {
				s()
			}
			if n := len(b.Published("orders.dead-letter")); n != 1 {
				t.Errorf("%d dead letters, want 1", n)
			}
			if rec, err := st.Get(context.Background(), []byte("poison")); err != nil || rec.State != idem.StateFailed {
				t.Errorf("record at the end: %+v, %v; want failed", rec, err)
			}
		})
	}
}
