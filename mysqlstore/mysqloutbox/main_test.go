package mysqloutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore/mysqloutbox"
	"github.com/idem-dev/idem/mysqlstore/mysqltest"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outboxtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The crash tests kill connections; the driver would log each.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newOutbox migrates an outbox table in a fresh database.
func newOutbox(t testing.TB) (*mysqloutbox.Outbox, *sql.DB) {
	t.Helper()
	_, db := mysqltest.NewDB(t)
	cfg := mysqloutbox.Config{DB: db, Table: "outbox", NewID: outboxtest.NewID(), Ordered: true, Logger: outboxtest.Quiet()}
	if err := mysqloutbox.Migrate(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	if err := mysqloutbox.Migrate(ctxT(t), cfg); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	ob, err := mysqloutbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.CheckSchema(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return ob, db
}

type myTx struct {
	ob *mysqloutbox.Outbox
	tx *sql.Tx
}

func (t myTx) Enqueue(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
	return t.ob.Enqueue(ctx, t.tx, msgs...)
}
func (t myTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t myTx) Rollback(context.Context) error { return t.tx.Rollback() }

// TestConformance runs the outbox suite on MariaDB.
func TestConformance(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Harness {
		ob, db := newOutbox(t)
		return outboxtest.Harness{
			Backend: ob,
			Begin: func(ctx context.Context) (outboxtest.Tx, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				return myTx{ob, tx}, nil
			},
			Crash: mysqloutbox.CrashBatch(db),
			BreakHeaders: func(t testing.TB, id string) {
				t.Helper()
				if _, err := db.ExecContext(ctxT(t), "UPDATE outbox SET headers = X'FF' WHERE id = ?", id); err != nil {
					t.Fatal(err)
				}
			},
		}
	}, outboxtest.Features{ConcurrentTx: true, HoldEnds: true})
}

// TestOrderedNeedsIndex: without Config.Ordered (and its index) ordered
// claims are refused rather than run as a scan.
func TestOrderedNeedsIndex(t *testing.T) {
	_, db := mysqltest.NewDB(t)
	cfg := mysqloutbox.Config{DB: db, Table: "outbox"}
	if err := mysqloutbox.Migrate(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	ob, err := mysqloutbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Claim(ctxT(t), outbox.ClaimRequest{Limit: 1, Ordered: true}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("ordered claim without the index: %v", err)
	}
}

// TestLargeEnqueueAllOrNothing: a call whose messages take several INSERTs
// (each at most MaxStatement) and whose last one holds a duplicate id
// fails with ErrDuplicateID and leaves none of its messages, while the
// transaction goes on with what it wrote before.
func TestLargeEnqueueAllOrNothing(t *testing.T) {
	ob, db := newOutbox(t)
	ctx := ctxT(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := ob.Enqueue(ctx, tx, outbox.Message{ID: "keep", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, outbox.MaxPayloadLen)
	call := []outbox.Message{{ID: "big-1", Topic: "t", Payload: big}, {ID: "big-2", Topic: "t", Payload: big}, {ID: "keep", Topic: "t"}}
	if _, err := ob.Enqueue(ctx, tx, call...); !errors.Is(err, outbox.ErrDuplicateID) {
		t.Fatalf("Enqueue with a duplicate in its last statement: %v, want ErrDuplicateID", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	b, err := ob.Claim(ctx, outbox.ClaimRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if rows := b.Rows(); len(rows) != 1 || rows[0].ID != "keep" {
		t.Fatalf("rows %+v, want only the message written before the failed call", rows)
	}
}

// TestHoldLeavesSessionClean: a claim with a Hold bounds its session's
// idle_transaction_timeout, and Settle and Release put it back: the
// connection returns to a pool that business transactions share, which
// the bound would otherwise end when they sit idle.
func TestHoldLeavesSessionClean(t *testing.T) {
	ob, db := newOutbox(t)
	db.SetMaxOpenConns(1) // every statement below runs on the claim's connection
	ctx := ctxT(t)
	var global int64
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.idle_transaction_timeout").Scan(&global); err != nil {
		t.Fatal(err)
	}
	for _, end := range []string{"settle", "release"} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Enqueue(ctx, tx, outbox.Message{ID: "hold-" + end, Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		b, err := ob.Claim(ctx, outbox.ClaimRequest{Limit: 10, Hold: time.Hour})
		if err != nil || len(b.Rows()) != 1 {
			t.Fatalf("Claim: %v", err)
		}
		if end == "settle" {
			err = b.Settle(ctx, outbox.Settlement{Sent: []int64{b.Rows()[0].Seq}})
		} else {
			err = b.Release(ctx)
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		var got int64
		if err := db.QueryRowContext(ctx, "SELECT @@SESSION.idle_transaction_timeout").Scan(&got); err != nil || got != global {
			t.Fatalf("after %s the pooled session's idle_transaction_timeout is %d (%v), want the global %d", end, got, err, global)
		}
	}
}
