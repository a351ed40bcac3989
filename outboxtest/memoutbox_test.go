package outboxtest_test

import (
	"context"
	"testing"

	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/memoutbox"
	"github.com/idem-dev/idem/outboxtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type memTx struct{ tx *memoutbox.Tx }

func (t memTx) Enqueue(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
	return t.tx.Enqueue(ctx, msgs...)
}
func (t memTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t memTx) Rollback(context.Context) error { t.tx.Rollback(); return nil }

func TestMemoutbox(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Harness {
		ob := memoutbox.New(memoutbox.Config{NewID: outboxtest.NewID()})
		return outboxtest.Harness{
			Backend: ob,
			Begin:   func(context.Context) (outboxtest.Tx, error) { return memTx{ob.Begin()}, nil },
		}
	}, outboxtest.Features{ConcurrentTx: true})
}
