package pgoutbox_test

import (
	"errors"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/outbox"
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
