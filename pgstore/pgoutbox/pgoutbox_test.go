package pgoutbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outboxtest"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestQueuePipelined: Queue puts the outbox INSERT in the caller's batch
// beside the business statement (one round trip); the message commits with
// the business row, and a duplicate id fails the batch with a unique
// violation.
func TestQueuePipelined(t *testing.T) {
	ob, cfg := newOutbox(t, nil)
	ctx := ctxT(t)
	biz := pgx.Identifier{cfg.Schema, "orders"}.Sanitize()
	if _, err := cfg.Pool.Exec(ctx, "CREATE TABLE "+biz+" (n int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	send := func(id string, n int) error {
		return pgx.BeginFunc(ctx, cfg.Pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO "+biz+" (n) VALUES ($1)", n)
			if _, err := ob.Queue(ctx, b, outbox.Message{ID: id, Topic: "t"}); err != nil {
				return err
			}
			return tx.SendBatch(ctx, b).Close()
		})
	}
	if err := send("q-1", 1); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if err := send("q-1", 2); !errors.As(err, &pe) || pe.Code != "23505" {
		t.Fatalf("duplicate id through Queue: %v, want a unique violation", err)
	}
	var rows int
	if err := cfg.Pool.QueryRow(ctx, "SELECT count(*) FROM "+biz).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("business rows %d, %v: the failed batch's transaction should have rolled back", rows, err)
	}
	b, err := ob.Claim(ctx, outbox.ClaimRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if r := b.Rows(); len(r) != 1 || r[0].ID != "q-1" {
		t.Fatalf("claimed %+v", r)
	}
}

// TestOrderedNeedsIndex: without Config.Ordered (and its index) ordered
// claims are refused rather than run as a scan.
func TestOrderedNeedsIndex(t *testing.T) {
	ob, _ := newOutbox(t, func(c *pgoutbox.Config) { c.Ordered = false })
	if _, err := ob.Claim(ctxT(t), outbox.ClaimRequest{Limit: 1, Ordered: true}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("ordered claim without the index: %v", err)
	}
	if !ob.Notifies() {
		t.Fatal("Notifies() false with NOTIFY on")
	}
}

// frozenPublisher stands for a relay that stopped mid-publish without its
// connection closing (its host lost power, a network partition, a process
// frozen): Publish blocks, whatever its context says, until thawed.
type frozenPublisher struct {
	entered chan struct{}
	thaw    chan struct{}
}

func (p frozenPublisher) Publish(context.Context, ...*broker.Message) error {
	close(p.entered)
	<-p.thaw
	return nil
}
func (frozenPublisher) Close() error { return nil }

// TestFrozenRelayFreesItsRows: a relay that stops between its claim and
// its settlement with its connection still open holds the claim's row
// locks for as long as the server keeps the session: with nothing sent on
// it, that was until TCP keepalive gave up (over two hours on Linux's
// defaults), or for ever for a process that is frozen, not dead. The claim
// bounds the transaction's idle time by what the relay needs
// (ClaimRequest.Hold, from PublishTimeout), so the server ends the session
// and another relay takes the rows.
func TestFrozenRelayFreesItsRows(t *testing.T) {
	ob, _ := newOutbox(t, nil)
	ctx := ctxT(t)
	if _, err := enqueueOne(t, ob, outbox.Message{ID: "frozen-1", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	pub := frozenPublisher{entered: make(chan struct{}), thaw: make(chan struct{})}
	relay, err := outbox.New(outbox.Config{Backend: ob, Publisher: pub, PublishTimeout: 200 * time.Millisecond, Logger: outboxtest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := relay.RunOnce(ctx); done <- err }()
	// thaw lets the relay go on and returns what RunOnce did; deferred
	// too, so that a failing test ends the relay before the cleanups.
	thaw := sync.OnceValue(func() error { close(pub.thaw); return <-done })
	defer thaw()
	<-pub.entered
	var rows []outbox.Row
	outboxtest.WaitFor(t, "another claim to get the frozen relay's rows", 30*time.Second, func() (bool, string) {
		b, err := ob.Claim(ctx, outbox.ClaimRequest{Limit: 10})
		if err != nil {
			return false, err.Error()
		}
		rows = b.Rows()
		_ = b.Release(ctx)
		return len(rows) == 1, "still held"
	})
	if thaw() == nil {
		t.Fatal("the thawed relay settled a claim the server had ended")
	}
	if rows[0].ID != "frozen-1" || rows[0].Attempts != 0 {
		t.Fatalf("rows %+v", rows)
	}
}

func enqueueOne(t testing.TB, ob *pgoutbox.Outbox, m outbox.Message) ([]string, error) {
	t.Helper()
	var ids []string
	err := pgx.BeginFunc(ctxT(t), sharedPool(t), func(tx pgx.Tx) error {
		var err error
		ids, err = ob.Enqueue(ctxT(t), tx, m)
		return err
	})
	return ids, err
}
