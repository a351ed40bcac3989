package consumer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// TestHeldToken: inside a Handler and a BatchHandler, HeldToken finds the
// runtime's claim by the message's idempotency key, the same token
// MessageToken gives; any other key, and a context outside a handler, has
// none.
func TestHeldToken(t *testing.T) {
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			check := func(ctx context.Context, m *broker.Message) error {
				want, ok := consumer.MessageToken(ctx, m)
				got, found := consumer.HeldToken(ctx, []byte(m.ID))
				if !ok || !found || got != want {
					return fmt.Errorf("%s: HeldToken = %d, %v; MessageToken = %d, %v", m.ID, got, found, want, ok)
				}
				if _, found := consumer.HeldToken(ctx, []byte(m.ID+"/other")); found {
					return fmt.Errorf("%s: a token for a key the runtime does not hold", m.ID)
				}
				return nil
			}
			errs := make(chan error, 100)
			if mode == "single" {
				cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
					errs <- check(ctx, m)
					return nil, nil
				}
			} else {
				cfg.BatchHandler = func(ctx context.Context, msgs []*broker.Message) error {
					for _, m := range msgs {
						errs <- check(ctx, m)
					}
					return nil
				}
			}
			for i := range 20 {
				e.publish(msg(fmt.Sprint(i), "x"))
			}
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			waitFor(t, "all handled", func() bool { return c.Stats().Handled == 20 })
			stop()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			if _, found := consumer.HeldToken(context.Background(), []byte("0")); found {
				t.Error("a token outside a handler")
			}
		})
	}
}
