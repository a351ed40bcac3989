package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
)

// TestDamagedRecord: a record with a value out of range in any column that
// can hold one (a state no version wrote, a token never issued, a raw key
// other than the one its hash files it under) is idem.ErrCorrupt for that
// key on every path, the transactional ones included, and is left as it is.
func TestDamagedRecord(t *testing.T) {
	s, cfg := newStore(t, layouts[0], "dmg")
	ctx := ctxT(t)
	damages := []struct{ name, set string }{
		{"UnknownState", "state = 99"},
		{"TokenNeverIssued", "token = 0"},
		{"OtherKey", "key = 'someone else'"},
	}
	ops := []struct {
		name string
		op   func(key []byte, tok uint64) error
	}{
		{"Get", func(key []byte, _ uint64) error { _, err := s.Get(ctx, key); return err }},
		{"Claim", func(key []byte, _ uint64) error { _, err := s.Claim(ctx, claimReq(string(key))); return err }},
		{"ClaimBatch", func(key []byte, _ uint64) error {
			res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{claimReq(string(key)), claimReq(string(key) + "-fresh")})
			if err != nil {
				return err
			}
			if res[1].Err != nil || res[1].Claim.Outcome != idem.OutcomeAcquired {
				t.Errorf("the other entry of the batch: %+v", res[1])
			}
			return res[0].Err
		}},
		{"Complete", func(key []byte, tok uint64) error { return s.Complete(ctx, key, tok, nil) }},
		{"Extend", func(key []byte, tok uint64) error { return s.Extend(ctx, key, tok, 1e9) }},
		{"CompleteBatch", func(key []byte, tok uint64) error {
			errs, err := s.CompleteBatch(ctx, []idem.Completion{{Key: key, Token: tok}})
			if err != nil {
				return err
			}
			return errs[0]
		}},
		{"ClaimTx", func(key []byte, _ uint64) error {
			tx, err := cfg.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			_, err = s.ClaimTx(ctx, tx, claimReq(string(key)))
			return err
		}},
		{"DoTx", func(key []byte, _ uint64) error {
			_, err := s.DoTx(ctx, claimReq(string(key)), func(context.Context, pgx.Tx, idem.Claim) ([]byte, error) {
				t.Error("the effect ran for a damaged record")
				return nil, nil
			})
			return err
		}},
	}
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			key := []byte("dmg-" + d.name)
			c, err := s.Claim(ctx, claimReq(string(key)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cfg.Pool.Exec(ctx, "UPDATE "+cfg.Schema+".rec SET "+d.set+" WHERE ns = 'dmg' AND key = $1", key); err != nil {
				t.Fatal(err)
			}
			for _, op := range ops {
				err := op.op(key, c.Record.Token)
				if !errors.Is(err, idem.ErrCorrupt) || errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
					t.Errorf("%s: %v, want idem.ErrCorrupt alone", op.name, err)
				}
				if got := s.ClassifyError(err); got != err {
					t.Errorf("%s: ClassifyError changed %v into %v", op.name, err, got)
				}
			}
			// Left as it is (the set clause doubles as the condition).
			var n int
			if err := cfg.Pool.QueryRow(ctx, "SELECT count(*) FROM "+cfg.Schema+".rec WHERE ns = 'dmg' AND "+d.set).Scan(&n); err != nil || n != 1 {
				t.Fatalf("%d damaged records left, %v; want the one, untouched", n, err)
			}
		})
	}
}
