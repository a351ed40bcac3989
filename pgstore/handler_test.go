package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/internal/txtest"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestConsumerTx: TxHandler, TxBatchHandler and DoTx inside a consumer
// handler (internal/txtest), each on a fresh schema with a ledger table.
func TestConsumerTx(t *testing.T) {
	txtest.Run(t, func(t *testing.T) txtest.Env[pgx.Tx] {
		s, cfg := newStore(t, layouts[0], "consumer")
		led := ledger(t, cfg.Pool, cfg.Schema)
		return txtest.Env[pgx.Tx]{
			Store: s,
			TxHandler: func(fn func(context.Context, pgx.Tx, *broker.Message) ([]byte, error)) (consumer.TxHandler, error) {
				return pgstore.TxHandler(s, pgstore.TxHandlerConfig{}, fn)
			},
			TxBatchHandler: func(fn func(context.Context, pgx.Tx, []*broker.Message) ([][]byte, error)) (consumer.TxBatchHandler, error) {
				return pgstore.TxBatchHandler(s, pgstore.TxHandlerConfig{}, fn)
			},
			DoTx: func(ctx context.Context, req idem.ClaimRequest, fn func(context.Context, pgx.Tx) ([]byte, error)) (idem.Claim, error) {
				return s.DoTx(ctx, req, func(ctx context.Context, tx pgx.Tx, _ idem.Claim) ([]byte, error) { return fn(ctx, tx) })
			},
			Insert: func(ctx context.Context, tx pgx.Tx, id string) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+led+" (k) VALUES ($1)", []byte(id))
				return err
			},
			Count:       func(t *testing.T, id string) int { return ledgerCount(t, cfg.Pool, led, []byte(id)) },
			Unavailable: &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"},
		}
	})
}

// TestFailTx: FailTx as the store contract's Fail, inside the caller's
// transaction.
func TestFailTx(t *testing.T) {
	for _, lc := range []layoutCase{layouts[0], layouts[3]} {
		t.Run(lc.name, func(t *testing.T) {
			s, cfg := newStore(t, lc, "failtx")
			ctx := ctxT(t)
			tx := func(fn func(tx pgx.Tx) error) error {
				return pgx.BeginFunc(ctx, cfg.Pool, fn)
			}
			t.Run("ClaimedInTheSameTransaction", func(t *testing.T) {
				var tok uint64
				err := tx(func(tx pgx.Tx) error {
					c, err := s.ClaimTx(ctx, tx, claimReq("a"))
					if err != nil {
						return err
					}
					tok = c.Record.Token
					if err := s.FailTx(ctx, tx, []byte("a"), tok, "bad input"); err != nil {
						return err
					}
					return s.FailTx(ctx, tx, []byte("a"), tok, "bad input") // a repeat is nil
				})
				if err != nil {
					t.Fatal(err)
				}
				rec, err := s.Get(ctx, []byte("a"))
				if err != nil || rec.State != idem.StateFailed || rec.LastError != "bad input" || rec.Token != tok {
					t.Fatalf("record %+v, %v", rec, err)
				}
				if c, err := s.Claim(ctx, claimReq("a")); err != nil || c.Outcome != idem.OutcomeFailed {
					t.Fatalf("claim after FailTx: %+v, %v", c, err)
				}
			})
			t.Run("StandaloneClaim", func(t *testing.T) {
				c, err := s.Claim(ctx, claimReq("b"))
				if err != nil {
					t.Fatal(err)
				}
				tok := c.Record.Token
				// Rolled back: nothing changes.
				errRollback := errors.New("rollback")
				if err := tx(func(tx pgx.Tx) error {
					if err := s.FailTx(ctx, tx, []byte("b"), tok, "x"); err != nil {
						return err
					}
					return errRollback
				}); !errors.Is(err, errRollback) {
					t.Fatal(err)
				}
				if st := mustGet(t, s, "b").State; st != idem.StateInProgress {
					t.Fatalf("after rollback: %s", st)
				}
				err = tx(func(tx pgx.Tx) error {
					if err := s.FailTx(ctx, tx, []byte("b"), tok+1, "x"); !errors.Is(err, idem.ErrFenced) {
						return fmt.Errorf("wrong token: %v, want ErrFenced", err)
					}
					if err := s.FailTx(ctx, tx, []byte("absent"), tok, "x"); !errors.Is(err, idem.ErrNotFound) {
						return fmt.Errorf("absent key: %v, want ErrNotFound", err)
					}
					return s.FailTx(ctx, tx, []byte("b"), tok, "") // the transaction is still usable
				})
				if err != nil {
					t.Fatal(err)
				}
				if st := mustGet(t, s, "b").State; st != idem.StateFailed {
					t.Fatalf("after commit: %s", st)
				}
			})
			t.Run("CompletedIsFenced", func(t *testing.T) {
				c, err := s.Claim(ctx, claimReq("c"))
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(ctx, []byte("c"), c.Record.Token, nil); err != nil {
					t.Fatal(err)
				}
				if err := tx(func(tx pgx.Tx) error { return s.FailTx(ctx, tx, []byte("c"), c.Record.Token, "x") }); !errors.Is(err, idem.ErrFenced) {
					t.Fatalf("FailTx on a completed record: %v, want ErrFenced", err)
				}
			})
			t.Run("InvalidArguments", func(t *testing.T) {
				long := string(make([]byte, idem.MaxCauseLen+1))
				err := tx(func(tx pgx.Tx) error {
					if err := s.FailTx(ctx, tx, []byte("d"), 0, "x"); !errors.Is(err, idem.ErrInvalidArgument) {
						return fmt.Errorf("token 0: %v", err)
					}
					if err := s.FailTx(ctx, tx, []byte("d"), 1, long); !errors.Is(err, idem.ErrInvalidArgument) {
						return fmt.Errorf("long cause: %v", err)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

func mustGet(t *testing.T, s *pgstore.Store, key string) idem.Record {
	t.Helper()
	rec, err := s.Get(ctxT(t), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
