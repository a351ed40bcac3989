package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ledger makes an effect table with NO unique constraint: a double effect
// shows up as two rows.
func ledger(t *testing.T, p *pgxpool.Pool, schema string) string {
	t.Helper()
	name := schema + ".ledger"
	if _, err := p.Exec(ctxT(t), "CREATE TABLE "+name+" (k bytea NOT NULL, n bigint NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	return name
}

func ledgerCount(t *testing.T, p *pgxpool.Pool, table string, key []byte) int {
	t.Helper()
	var n int
	if err := p.QueryRow(ctxT(t), "SELECT count(*) FROM "+table+" WHERE k = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func claimReq(key string) idem.ClaimRequest {
	return idem.ClaimRequest{Key: []byte(key), Lease: time.Minute, TTL: time.Hour}
}

func TestDoTx(t *testing.T) {
	for _, lc := range []layoutCase{layouts[0], layouts[1], layouts[3]} {
		t.Run(lc.name, func(t *testing.T) {
			s, cfg := newStore(t, lc, "tx")
			led := ledger(t, cfg.Pool, cfg.Schema)
			effect := func(key string, res string) pgstore.TxFunc {
				return func(ctx context.Context, tx pgx.Tx, c idem.Claim) ([]byte, error) {
					_, err := tx.Exec(ctx, "INSERT INTO "+led+" (k) VALUES ($1)", []byte(key))
					return []byte(res), err
				}
			}
			t.Run("FirstThenReplay", func(t *testing.T) {
				c, err := s.DoTx(ctxT(t), claimReq("a"), effect("a", "r1"))
				if err != nil || c.Outcome != idem.OutcomeAcquired || c.Record.State != idem.StateCompleted || string(c.Record.Result) != "r1" {
					t.Fatalf("first: %+v, %v", c, err)
				}
				rec, err := s.Get(ctxT(t), []byte("a"))
				if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "r1" || rec.Token != c.Record.Token {
					t.Fatalf("get: %+v, %v", rec, err)
				}
				c2, err := s.DoTx(ctxT(t), claimReq("a"), func(context.Context, pgx.Tx, idem.Claim) ([]byte, error) {
					t.Error("effect ran for a duplicate")
					return nil, nil
				})
				if err != nil || c2.Outcome != idem.OutcomeCompleted || string(c2.Record.Result) != "r1" {
					t.Fatalf("replay: %+v, %v", c2, err)
				}
				if n := ledgerCount(t, cfg.Pool, led, []byte("a")); n != 1 {
					t.Fatalf("ledger has %d rows for a, want 1", n)
				}
			})
			t.Run("HandlerErrorRollsBack", func(t *testing.T) {
				boom := errors.New("boom")
				_, err := s.DoTx(ctxT(t), claimReq("b"), func(ctx context.Context, tx pgx.Tx, c idem.Claim) ([]byte, error) {
					if _, err := effect("b", "")(ctx, tx, c); err != nil {
						return nil, err
					}
					return nil, boom
				})
				var he *idem.HandlerError
				if !errors.As(err, &he) || !errors.Is(err, boom) {
					t.Fatalf("err = %v, want HandlerError(boom)", err)
				}
				if _, err := s.Get(ctxT(t), []byte("b")); !errors.Is(err, idem.ErrNotFound) {
					t.Fatalf("record after rollback: %v, want ErrNotFound", err)
				}
				if n := ledgerCount(t, cfg.Pool, led, []byte("b")); n != 0 {
					t.Fatalf("ledger has %d rows after rollback", n)
				}
				// The key is free again, with a larger token than before.
				c, err := s.DoTx(ctxT(t), claimReq("b"), effect("b", "ok"))
				if err != nil || c.Outcome != idem.OutcomeAcquired {
					t.Fatalf("after rollback: %+v, %v", c, err)
				}
			})
			t.Run("ConcurrentDuplicates", func(t *testing.T) {
				const n = 12
				var ran atomic.Int32
				var wg sync.WaitGroup
				outcomes := make([]idem.Outcome, n)
				errs := make([]error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c, err := s.DoTx(ctxT(t), claimReq("c"), func(ctx context.Context, tx pgx.Tx, c idem.Claim) ([]byte, error) {
							ran.Add(1)
							time.Sleep(20 * time.Millisecond) // others queue on the row meanwhile
							return effect("c", "once")(ctx, tx, c)
						})
						outcomes[i], errs[i] = c.Outcome, err
					}()
				}
				wg.Wait()
				acq := 0
				for i := range n {
					if errs[i] != nil {
						t.Fatalf("caller %d: %v", i, errs[i])
					}
					switch outcomes[i] {
					case idem.OutcomeAcquired:
						acq++
					case idem.OutcomeCompleted:
					default:
						t.Fatalf("caller %d: outcome %s", i, outcomes[i])
					}
				}
				if acq != 1 || ran.Load() != 1 || ledgerCount(t, cfg.Pool, led, []byte("c")) != 1 {
					t.Fatalf("acquired %d, effect ran %d, ledger %d; want 1, 1, 1", acq, ran.Load(), ledgerCount(t, cfg.Pool, led, []byte("c")))
				}
			})
			t.Run("HeldByStandaloneLease", func(t *testing.T) {
				if _, err := s.Claim(ctxT(t), claimReq("d")); err != nil {
					t.Fatal(err)
				}
				c, err := s.DoTx(ctxT(t), claimReq("d"), func(context.Context, pgx.Tx, idem.Claim) ([]byte, error) {
					t.Error("effect ran while another holder's lease is live")
					return nil, nil
				})
				// An error, not just an outcome: a caller that only checks the
				// error must not ack an in-progress duplicate as done.
				var ip *idem.InProgressError
				if !errors.As(err, &ip) || c.Outcome != idem.OutcomeInProgress || ip.LeaseUntil.IsZero() {
					t.Fatalf("got %+v, %v; want in progress with an *idem.InProgressError", c, err)
				}
			})
			t.Run("Failed", func(t *testing.T) {
				c, err := s.Claim(ctxT(t), claimReq("f"))
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Fail(ctxT(t), []byte("f"), c.Record.Token, "poison"); err != nil {
					t.Fatal(err)
				}
				_, err = s.DoTx(ctxT(t), claimReq("f"), func(context.Context, pgx.Tx, idem.Claim) ([]byte, error) {
					t.Error("effect ran for a failed key")
					return nil, nil
				})
				var fe *idem.FailedError
				if !errors.As(err, &fe) || fe.Cause != "poison" {
					t.Fatalf("err = %v, want *idem.FailedError with the cause", err)
				}
			})
			t.Run("FingerprintMismatch", func(t *testing.T) {
				r := claimReq("e")
				r.Fingerprint = []byte("x")
				if _, err := s.DoTx(ctxT(t), r, effect("e", "")); err != nil {
					t.Fatal(err)
				}
				r.Fingerprint = []byte("y")
				if _, err := s.DoTx(ctxT(t), r, effect("e", "")); !errors.Is(err, idem.ErrFingerprintMismatch) {
					t.Fatalf("err = %v, want ErrFingerprintMismatch", err)
				}
			})
		})
	}
}

// TestDoTxSerializable makes every transaction update one counter row under
// SERIALIZABLE, so concurrent ones fail with 40001 and must be retried: the
// counter ends equal to the number of keys, each effect applied once.
func TestDoTxSerializable(t *testing.T) {
	s, cfg := newStore(t, layouts[0], "ser")
	p := cfg.Pool
	ctr := cfg.Schema + ".counter"
	if _, err := p.Exec(ctxT(t), "CREATE TABLE "+ctr+" (id int PRIMARY KEY, n int NOT NULL); INSERT INTO "+ctr+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	cfg.TxRetries = 50 // every transaction conflicts with every other
	s, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const keys = 16
	var wg sync.WaitGroup
	var attempts atomic.Int32
	errs := make([]error, keys)
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.DoTxOptions(ctxT(t), pgx.TxOptions{IsoLevel: pgx.Serializable}, claimReq(fmt.Sprintf("k%d", i)),
				func(ctx context.Context, tx pgx.Tx, c idem.Claim) ([]byte, error) {
					attempts.Add(1)
					var n int
					if err := tx.QueryRow(ctx, "SELECT n FROM "+ctr+" WHERE id = 1").Scan(&n); err != nil {
						return nil, err
					}
					_, err := tx.Exec(ctx, "UPDATE "+ctr+" SET n = $1 WHERE id = 1", n+1)
					return nil, err
				})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	var n int
	if err := p.QueryRow(ctxT(t), "SELECT n FROM "+ctr+" WHERE id = 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != keys {
		t.Fatalf("counter = %d, want %d (lost or doubled effects)", n, keys)
	}
	t.Logf("%d effects applied once each in %d attempts", keys, attempts.Load())
}

func TestClaimTx(t *testing.T) {
	s, cfg := newStore(t, layouts[0], "ctx")
	p := cfg.Pool
	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		tx, err := p.Begin(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.ClaimTx(ctxT(t), tx, claimReq("r"))
		if err != nil || c.Outcome != idem.OutcomeAcquired {
			t.Fatalf("%+v, %v", c, err)
		}
		if err := tx.Rollback(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctxT(t), []byte("r")); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("after rollback: %v", err)
		}
	})
	t.Run("ClaimCompleteCommit", func(t *testing.T) {
		tx, err := p.Begin(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctxT(t))
		c, err := s.ClaimTx(ctxT(t), tx, claimReq("k"))
		if err != nil {
			t.Fatal(err)
		}
		// Invisible to others until commit.
		if _, err := s.Get(ctxT(t), []byte("k")); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("uncommitted record visible: %v", err)
		}
		if err := s.CompleteTx(ctxT(t), tx, []byte("k"), c.Record.Token, []byte("res")); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctxT(t), []byte("k"))
		if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "res" {
			t.Fatalf("%+v, %v", rec, err)
		}
	})
	t.Run("BatchInTx", func(t *testing.T) {
		tx, err := p.Begin(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.ClaimBatchTx(ctxT(t), tx, []idem.ClaimRequest{claimReq("b1"), claimReq("b2"), claimReq("b1")})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Claim.Outcome != idem.OutcomeAcquired || res[1].Claim.Outcome != idem.OutcomeAcquired || res[2].Claim.Outcome != idem.OutcomeInProgress {
			t.Fatalf("%+v", res)
		}
		if err := tx.Rollback(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctxT(t), []byte("b1")); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("after rollback: %v", err)
		}
	})
}

// TestCommitConnectionLost: DoTx's COMMIT loses its answer, or is lost
// itself (the server sees the client leave, or sees nothing at all, as in
// a network partition), or arrives late. Each time DoTx must tell from the
// server whether the transaction committed. The connections go through a
// proxy that tells the client a PID other than its backend's, as a pooler
// (PgBouncer) does: here the PID of another, innocent session, which must
// survive. Resolving by terminating the backend by PID and then reading the
// record (the approach before) killed the innocent session, and in
// CommitArrivesLate read the record before the late COMMIT landed: it said
// "not applied" for a transaction that then committed.
func TestCommitConnectionLost(t *testing.T) {
	base := sharedPool(t)
	pc := base.Config().ConnConfig
	proxy := newPgProxy(t, net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)))
	victim, err := base.Acquire(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Release()
	proxy.fakePID.Store(int32(victim.Conn().PgConn().PID()))
	pp := proxy.pool(t, 4)
	schema := testSchema(t, base)
	s, cfg := openStore(t, pgstore.Config{Pool: pp, Schema: schema, Table: "rec", Namespace: "cut", CommitIdleTimeout: 500 * time.Millisecond})
	led := ledger(t, base, schema)
	effect := func(key string) pgstore.TxFunc {
		return func(ctx context.Context, tx pgx.Tx, c idem.Claim) ([]byte, error) {
			_, err := tx.Exec(ctx, "INSERT INTO "+led+" (k) VALUES ($1)", []byte(key))
			return []byte("done"), err
		}
	}
	cases := []struct {
		name    string
		mode    cutMode
		delay   time.Duration
		applied bool
	}{
		{"CommitArrivedAnswerLost", cutAfter, 0, true},
		{"CommitNeverArrived", cutBefore, 0, false},
		{"CommitNeverArrivedServerUnaware", cutBeforeSilent, 0, false},
		{"CommitArrivesLate", cutDelayed, 200 * time.Millisecond, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.name
			if got := victim.Conn().PgConn().PID(); proxy.fakePID.Load() != int32(got) {
				t.Fatalf("fake PID %d is not the innocent session's %d", proxy.fakePID.Load(), got)
			}
			fired := proxy.arm(sqlHas("commit"), tc.mode, tc.delay)
			c, err := s.DoTx(ctxT(t), claimReq(key), effect(key))
			select {
			case <-fired:
			case <-time.After(10 * time.Second):
				t.Fatal("the proxy never saw the COMMIT")
			}
			n := ledgerCount(t, base, led, []byte(key))
			rec, gerr := s.Get(ctxT(t), []byte(key))
			t.Logf("DoTx: %v", err)
			if tc.applied {
				if err != nil || c.Record.State != idem.StateCompleted || n != 1 || gerr != nil || rec.State != idem.StateCompleted || rec.Token != c.Record.Token {
					t.Fatalf("DoTx = %+v, %v; ledger %d; record %+v, %v: want resolved as committed", c, err, n, rec, gerr)
				}
			} else {
				if !errors.Is(err, idem.ErrUnavailable) || n != 0 || !errors.Is(gerr, idem.ErrNotFound) {
					t.Fatalf("DoTx err = %v; ledger %d; record err %v: want resolved as not applied", err, n, gerr)
				}
				// Safe to run again: it applies once.
				if _, err := s.DoTx(ctxT(t), claimReq(key), effect(key)); err != nil {
					t.Fatal(err)
				}
				if n := ledgerCount(t, base, led, []byte(key)); n != 1 {
					t.Fatalf("ledger %d after retry", n)
				}
			}
			if _, err := victim.Exec(ctxT(t), "SELECT 1"); err != nil {
				t.Fatalf("the session whose PID the client was told was hit: %v", err)
			}
		})
	}
	_ = cfg
}

// TestCompleteBatchTx completes held claims in the caller's transaction:
// each entry judged as CompleteTx would judge it, nothing visible before
// commit, nothing applied after a rollback.
func TestCompleteBatchTx(t *testing.T) {
	for _, lc := range []layoutCase{layouts[0], layouts[1], layouts[3]} {
		t.Run(lc.name, func(t *testing.T) {
			s, cfg := newStore(t, lc, "cbtx")
			ctx := ctxT(t)
			keys := []string{"c1", "c2", "c3", "c4"}
			reqs := make([]idem.ClaimRequest, len(keys))
			for i, k := range keys {
				reqs[i] = claimReq(k)
			}
			res, err := s.ClaimBatch(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			tok := func(i int) uint64 { return res[i].Claim.Record.Token }
			cs := []idem.Completion{
				{Key: []byte("c1"), Token: tok(0), Result: []byte("r1")},
				{Key: []byte("c2"), Token: tok(1) + 1}, // not the holder's token
				{Key: []byte("never"), Token: 7},
				{Key: []byte("c3"), Token: tok(2)},
				{Key: nil, Token: 1},
				{Key: []byte("c1"), Token: tok(0), Result: []byte("r1")}, // repeat in the same batch
			}
			for _, commit := range []bool{false, true} {
				tx, err := cfg.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				errs, err := s.CompleteBatchTx(ctx, tx, cs)
				if err != nil {
					_ = tx.Rollback(ctx)
					t.Fatal(err)
				}
				want := []error{nil, idem.ErrFenced, idem.ErrNotFound, nil, idem.ErrInvalidKey, nil}
				for i, w := range want {
					if (w == nil) != (errs[i] == nil) || (w != nil && !errors.Is(errs[i], w)) {
						t.Errorf("commit=%v entry %d: %v, want %v", commit, i, errs[i], w)
					}
				}
				if rec, err := s.Get(ctx, []byte("c1")); err != nil || rec.State != idem.StateInProgress {
					t.Fatalf("before commit: %+v, %v", rec, err)
				}
				if commit {
					err = tx.Commit(ctx)
				} else {
					err = tx.Rollback(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			for i, k := range keys {
				rec, err := s.Get(ctx, []byte(k))
				if err != nil {
					t.Fatal(err)
				}
				want := idem.StateInProgress
				if i == 0 || i == 2 {
					want = idem.StateCompleted
				}
				if rec.State != want || (i == 0 && string(rec.Result) != "r1") {
					t.Errorf("key %s after commit: %s %q, want %s", k, rec.State, rec.Result, want)
				}
			}
			// Completing again outside the transaction is an idempotent repeat.
			if err := s.Complete(ctx, []byte("c1"), tok(0), []byte("r1")); err != nil {
				t.Errorf("repeat after commit: %v", err)
			}
		})
	}
}
