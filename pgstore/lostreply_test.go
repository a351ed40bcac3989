package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

// TestLostReplyNotResent: the server runs a write statement and its answer
// is lost (the connection breaks on the way back). Neither pgx nor pgstore
// may send the statement again (a claim sent again finds its own record and
// answers "in progress": the caller would wait out its own lease, with an
// attempt counted and nothing run), and the caller must be told
// idem.ErrUnknownOutcome, so it reads the record before deciding. The proxy
// counts the requests that reach the server: exactly one per operation.
func TestLostReplyNotResent(t *testing.T) {
	base := sharedPool(t)
	pc := base.Config().ConnConfig
	proxy := newPgProxy(t, net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)))
	s, _ := openStore(t, pgstore.Config{Pool: proxy.pool(t, 4), Schema: testSchema(t, base), Table: "rec", Namespace: "lost"})
	ctx := ctxT(t)
	held := func(key string) uint64 {
		c, err := s.Claim(ctx, claimReq(key))
		if err != nil {
			t.Fatal(err)
		}
		return c.Record.Token
	}
	claimSQL := sqlHas("insert into")
	completeSQL := sqlHas("state = 2, result")
	inProgress := func(t *testing.T, rec idem.Record, err error) {
		if err != nil || rec.State != idem.StateInProgress || rec.Attempts != 1 {
			t.Fatalf("record %+v, %v: want in progress after one attempt", rec, err)
		}
	}
	completed := func(t *testing.T, rec idem.Record, err error) {
		if err != nil || rec.State != idem.StateCompleted {
			t.Fatalf("record %+v, %v: want completed", rec, err)
		}
	}
	// Each case prepares its key, then returns the operation whose
	// answer the proxy loses.
	cases := []struct {
		name  string
		match func(string) bool
		setup func(key string) func() error
		after func(t *testing.T, rec idem.Record, err error)
	}{
		{"Claim", claimSQL, func(key string) func() error {
			return func() error { _, err := s.Claim(ctx, claimReq(key)); return err }
		}, inProgress},
		{"ClaimBatch", claimSQL, func(key string) func() error {
			return func() error {
				_, err := s.ClaimBatch(ctx, []idem.ClaimRequest{claimReq(key), claimReq(key + "-2")})
				return err
			}
		}, inProgress},
		{"Complete", completeSQL, func(key string) func() error {
			tok := held(key)
			return func() error { return s.Complete(ctx, []byte(key), tok, []byte("r")) }
		}, completed},
		{"CompleteBatch", completeSQL, func(key string) func() error {
			tok := held(key)
			return func() error {
				_, err := s.CompleteBatch(ctx, []idem.Completion{{Key: []byte(key), Token: tok, Result: []byte("r")}})
				return err
			}
		}, completed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := "lost-" + tc.name
			op := tc.setup(key)
			proxy.setWatch(tc.match)
			fired := proxy.arm(tc.match, cutAfter, 0)
			err := op()
			select {
			case <-fired:
			case <-time.After(10 * time.Second):
				t.Fatal("the proxy never saw the statement")
			}
			if !errors.Is(err, idem.ErrUnknownOutcome) {
				t.Fatalf("err = %v, want idem.ErrUnknownOutcome", err)
			}
			if n := proxy.watched(); n != 1 {
				t.Fatalf("the statement reached the server %d times, want once", n)
			}
			proxy.setWatch(nil)
			rec, gerr := s.Get(context.Background(), []byte(key))
			tc.after(t, rec, gerr)
		})
	}
}

// TestLostReplyInTransaction: the answer to a statement inside a
// transaction is lost (DoTx's claim or completion, a caller's ClaimTx).
// The transaction can no longer commit, so nothing is applied: the error
// is idem.ErrUnavailable, not ErrUnknownOutcome (which would make the
// caller wait and read for an outcome that cannot have happened), and the
// key is acquirable right after.
func TestLostReplyInTransaction(t *testing.T) {
	base := sharedPool(t)
	pc := base.Config().ConnConfig
	proxy := newPgProxy(t, net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)))
	pp := proxy.pool(t, 4)
	s, _ := openStore(t, pgstore.Config{Pool: pp, Schema: testSchema(t, base), Table: "rec", Namespace: "lostx"})
	ctx := ctxT(t)
	ran := 0
	doTx := func(key string) error {
		_, err := s.DoTx(ctx, claimReq(key), func(context.Context, pgx.Tx, idem.Claim) ([]byte, error) {
			ran++
			return []byte("r"), nil
		})
		return err
	}
	cases := []struct {
		name  string
		match func(string) bool
		op    func(key string) error
	}{
		{"DoTxClaim", sqlHas("insert into"), doTx},
		{"DoTxComplete", sqlHas("state = 2, result"), doTx},
		{"ClaimTx", sqlHas("insert into"), func(key string) error {
			tx, err := pp.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			_, err = s.ClaimTx(ctx, tx, claimReq(key))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := "lostx-" + tc.name
			fired := proxy.arm(tc.match, cutAfter, 0)
			err := tc.op(key)
			select {
			case <-fired:
			case <-time.After(10 * time.Second):
				t.Fatal("the proxy never saw the statement")
			}
			if !errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
				t.Fatalf("err = %v, want idem.ErrUnavailable alone", err)
			}
			if _, err := s.Get(ctx, []byte(key)); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("record after the lost transaction: %v, want ErrNotFound", err)
			}
			c, err := s.Claim(ctx, claimReq(key))
			if err != nil || c.Outcome != idem.OutcomeAcquired {
				t.Fatalf("claim after the lost transaction: %s, %v; want acquired", c.Outcome, err)
			}
		})
	}
	if ran != 1 {
		t.Fatalf("the effect ran %d times, want once (in DoTxComplete, before the completion's answer was lost)", ran)
	}
}
