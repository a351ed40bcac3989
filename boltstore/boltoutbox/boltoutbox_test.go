package boltoutbox_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/idem-dev/idem/boltstore/boltoutbox"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outboxtest"
	"go.etcd.io/bbolt"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openDB(t testing.TB, path string) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// boltTx is a business transaction: a bbolt read-write transaction held
// open until Commit or Rollback (bbolt writers take turns, so the suite
// runs without ConcurrentTx).
type boltTx struct {
	ob *boltoutbox.Outbox
	tx *bbolt.Tx
}

func (t boltTx) Enqueue(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
	return t.ob.Enqueue(ctx, t.tx, msgs...)
}
func (t boltTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t boltTx) Rollback(context.Context) error { return t.tx.Rollback() }

func TestConformance(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Harness {
		db := openDB(t, filepath.Join(t.TempDir(), "app.db"))
		ob, err := boltoutbox.New(boltoutbox.Config{DB: db, NewID: outboxtest.NewID()})
		if err != nil {
			t.Fatal(err)
		}
		return outboxtest.Harness{
			Backend: ob,
			Begin: func(context.Context) (outboxtest.Tx, error) {
				tx, err := db.Begin(true)
				if err != nil {
					return nil, err
				}
				return boltTx{ob, tx}, nil
			},
			BreakHeaders: func(t testing.TB, id string) {
				t.Helper()
				if err := boltoutbox.BreakHeaders(db, boltoutbox.DefaultBucket, id); err != nil {
					t.Fatal(err)
				}
			},
		}
	}, outboxtest.Features{})
}

// TestBusinessDataAndOutboxOneTransaction: the business write and the
// message commit together, roll back together, and the outbox survives a
// reopen of the file (a restarted process finds its pending rows).
func TestBusinessDataAndOutboxOneTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	db := openDB(t, path)
	ob, err := boltoutbox.New(boltoutbox.Config{DB: db, NewID: outboxtest.NewID()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	write := func(order string, fail bool) error {
		return db.Update(func(tx *bbolt.Tx) error {
			orders, err := tx.CreateBucketIfNotExists([]byte("orders"))
			if err != nil {
				return err
			}
			if err := orders.Put([]byte(order), []byte("paid")); err != nil {
				return err
			}
			if _, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: []byte(order), Payload: []byte(order + " paid")}); err != nil {
				return err
			}
			if fail {
				return errors.New("business rule failed")
			}
			return nil
		})
	}
	if err := write("o-1", false); err != nil {
		t.Fatal(err)
	}
	if err := write("o-2", true); err == nil {
		t.Fatal("the failing transaction committed")
	}
	db.Close()
	db = openDB(t, path)
	ob, err = boltoutbox.New(boltoutbox.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket([]byte("orders")).Get([]byte("o-2")); v != nil {
			t.Error("rolled-back business write is there")
		}
		return nil
	})
	b, err := ob.Claim(ctx, outbox.ClaimRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	rows := b.Rows()
	if len(rows) != 1 || !bytes.Equal(rows[0].Payload, []byte("o-1 paid")) {
		t.Fatalf("after reopening: %+v, want the committed message only", rows)
	}
	_ = b.Release(ctx)
	var ro error
	_ = db.View(func(tx *bbolt.Tx) error {
		_, ro = ob.Enqueue(ctx, tx, outbox.Message{Topic: "t"})
		return nil
	})
	if ro == nil {
		t.Fatal("Enqueue in a read-only transaction succeeded")
	}
}
