package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/internal/txtest"
	"github.com/idem-dev/idem/mysqlstore"
)

// TestConsumerTx: TxHandler, TxBatchHandler and DoTx inside a consumer
// handler (internal/txtest), each on a fresh database with a ledger table.
func TestConsumerTx(t *testing.T) {
	txtest.Run(t, func(t *testing.T) txtest.Env[*sql.Tx] {
		s, db := newStore(t, mysqlstore.Config{Namespace: "consumer"})
		makeLedger(t, db)
		return txtest.Env[*sql.Tx]{
			Store: s,
			TxHandler: func(fn func(context.Context, *sql.Tx, *broker.Message) ([]byte, error)) (consumer.TxHandler, error) {
				return mysqlstore.TxHandler(s, mysqlstore.TxHandlerConfig{}, fn)
			},
			TxBatchHandler: func(fn func(context.Context, *sql.Tx, []*broker.Message) ([][]byte, error)) (consumer.TxBatchHandler, error) {
				return mysqlstore.TxBatchHandler(s, mysqlstore.TxHandlerConfig{}, fn)
			},
			DoTx: func(ctx context.Context, req idem.ClaimRequest, fn func(context.Context, *sql.Tx) ([]byte, error)) (idem.Claim, error) {
				return s.DoTx(ctx, req, func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) { return fn(ctx, tx) })
			},
			Insert: func(ctx context.Context, tx *sql.Tx, id string) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO ledger (k) VALUES (?)", []byte(id))
				return err
			},
			Count:       func(t *testing.T, id string) int { return ledgerCount(t, db, id) },
			Unavailable: &mysql.MySQLError{Number: 1053, Message: "Server shutdown in progress"},
		}
	})
}

// TestFailTx: FailTx as the store contract's Fail, inside the caller's
// transaction, on a Store.BeginTx transaction and on a plain *sql.Tx.
func TestFailTx(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{Namespace: "failtx"})
	ctx := testCtx(t)
	type txn struct {
		tx               *sql.Tx
		commit, rollback func() error
	}
	begins := map[string]func() (txn, error){
		"BeginTx": func() (txn, error) {
			tx, err := s.BeginTx(ctx, nil)
			if err != nil {
				return txn{}, err
			}
			return txn{tx.Tx, tx.Commit, tx.Rollback}, nil
		},
		"sql.DB": func() (txn, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return txn{}, err
			}
			return txn{tx, tx.Commit, tx.Rollback}, nil
		},
	}
	for name, begin := range begins {
		t.Run(name, func(t *testing.T) {
			key := func(k string) []byte { return []byte(name + "/" + k) }
			t.Run("ClaimedInTheSameTransaction", func(t *testing.T) {
				tx, err := begin()
				if err != nil {
					t.Fatal(err)
				}
				defer tx.rollback()
				c, err := s.ClaimTx(ctx, tx.tx, claimReq(string(key("a"))))
				if err != nil {
					t.Fatal(err)
				}
				tok := c.Record.Token
				if err := s.FailTx(ctx, tx.tx, key("a"), tok, "bad input"); err != nil {
					t.Fatal(err)
				}
				if err := s.FailTx(ctx, tx.tx, key("a"), tok, "bad input"); err != nil {
					t.Fatalf("repeat: %v", err)
				}
				if err := tx.commit(); err != nil {
					t.Fatal(err)
				}
				rec, err := s.Get(ctx, key("a"))
				if err != nil || rec.State != idem.StateFailed || rec.LastError != "bad input" || rec.Token != tok {
					t.Fatalf("record %+v, %v", rec, err)
				}
				if c, err := s.Claim(ctx, claimReq(string(key("a")))); err != nil || c.Outcome != idem.OutcomeFailed {
					t.Fatalf("claim after FailTx: %+v, %v", c, err)
				}
			})
			t.Run("StandaloneClaim", func(t *testing.T) {
				c, err := s.Claim(ctx, claimReq(string(key("b"))))
				if err != nil {
					t.Fatal(err)
				}
				tok := c.Record.Token
				tx, err := begin()
				if err != nil {
					t.Fatal(err)
				}
				if err := s.FailTx(ctx, tx.tx, key("b"), tok, "x"); err != nil {
					t.Fatal(err)
				}
				if err := tx.rollback(); err != nil {
					t.Fatal(err)
				}
				if st := mustGet(t, s, string(key("b"))).State; st != idem.StateInProgress {
					t.Fatalf("after rollback: %s", st)
				}
				tx, err = begin()
				if err != nil {
					t.Fatal(err)
				}
				defer tx.rollback()
				if err := s.FailTx(ctx, tx.tx, key("b"), tok+1, "x"); !errors.Is(err, idem.ErrFenced) {
					t.Fatalf("wrong token: %v, want ErrFenced", err)
				}
				if err := s.FailTx(ctx, tx.tx, key("absent"), tok, "x"); !errors.Is(err, idem.ErrNotFound) {
					t.Fatalf("absent key: %v, want ErrNotFound", err)
				}
				if err := s.FailTx(ctx, tx.tx, key("b"), tok, ""); err != nil {
					t.Fatal(err)
				}
				if err := tx.commit(); err != nil {
					t.Fatal(err)
				}
				if st := mustGet(t, s, string(key("b"))).State; st != idem.StateFailed {
					t.Fatalf("after commit: %s", st)
				}
			})
			t.Run("CompletedIsFenced", func(t *testing.T) {
				c, err := s.Claim(ctx, claimReq(string(key("c"))))
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(ctx, key("c"), c.Record.Token, nil); err != nil {
					t.Fatal(err)
				}
				tx, err := begin()
				if err != nil {
					t.Fatal(err)
				}
				defer tx.rollback()
				if err := s.FailTx(ctx, tx.tx, key("c"), c.Record.Token, "x"); !errors.Is(err, idem.ErrFenced) {
					t.Fatalf("FailTx on a completed record: %v, want ErrFenced", err)
				}
			})
			t.Run("InvalidArguments", func(t *testing.T) {
				tx, err := begin()
				if err != nil {
					t.Fatal(err)
				}
				defer tx.rollback()
				long := string(make([]byte, idem.MaxCauseLen+1))
				for what, err := range map[string]error{
					"token 0":    s.FailTx(ctx, tx.tx, key("d"), 0, "x"),
					"long cause": s.FailTx(ctx, tx.tx, key("d"), 1, long),
					"nil tx":     s.FailTx(ctx, nil, key("d"), 1, "x"),
				} {
					if !errors.Is(err, idem.ErrInvalidArgument) {
						t.Errorf("%s: %v, want ErrInvalidArgument", what, err)
					}
				}
			})
		})
	}
}

func mustGet(t *testing.T, s *mysqlstore.Store, key string) idem.Record {
	t.Helper()
	rec, err := s.Get(testCtx(t), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
