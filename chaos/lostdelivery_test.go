package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/chaos/internal/shm"
)

type lostAcker struct{ lost bool }

func (a *lostAcker) Ack(context.Context) error                { return nil }
func (a *lostAcker) Nak(context.Context, time.Duration) error { return nil }
func (a *lostAcker) Term(context.Context, string) error       { return nil }
func (a *lostAcker) InProgress(context.Context) error {
	if a.lost {
		return fmt.Errorf("partition revoked: %w", broker.ErrDeliveryLost)
	}
	return nil
}

type oneSub struct {
	broker.Subscriber
	msgs []*broker.Message
}

func (s *oneSub) Fetch(context.Context, int) ([]*broker.Message, error) { return s.msgs, nil }

// TestLostDeliverySettles: a delivery the broker reports lost through
// InProgress is dropped by the consumer with no broker call (eb9c08b); the
// worker's count of unsettled deliveries must let it go, or the drain
// waits for it for ever ("not drained ... 43 unsettled" in
// partition/bolt/kafka/batch50 after a rebalance).
func TestLostDeliverySettles(t *testing.T) {
	ctr, err := shm.Create(filepath.Join(t.TempDir(), "ctr"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctr.Close()
	crash := &crasher{ctr: ctr}
	lost, kept := &lostAcker{lost: true}, &lostAcker{}
	sub := wrapSubscriber(&oneSub{msgs: []*broker.Message{{ID: "a", Acker: lost}, {ID: "b", Acker: kept}}}, ctr, crash, new(sync.Map))
	ctx := context.Background()
	msgs, _ := sub.Fetch(ctx, 2)
	if got := ctr.Get(shm.Unsettled); got != 2 {
		t.Fatalf("unsettled after fetch: %d, want 2", got)
	}
	for _, m := range msgs {
		_ = m.Acker.InProgress(ctx)
		_ = m.Acker.InProgress(ctx)
	}
	if got := ctr.Get(shm.Unsettled); got != 1 {
		t.Fatalf("unsettled after the broker reported one lost: %d, want 1", got)
	}
	_ = msgs[1].Acker.Ack(ctx)
	if got := ctr.Get(shm.Unsettled); got != 0 {
		t.Fatalf("unsettled after the other's ack: %d, want 0", got)
	}
}
