package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// Two DoTx whose effects lock two rows in opposite orders deadlock; InnoDB
// rolls one back (1213) and DoTx runs it again. Each effect lands once.
func TestDoTxRetriesDeadlock(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	ctx := testCtx(t)
	if _, err := db.ExecContext(ctx, "CREATE TABLE acct (id INT PRIMARY KEY, bal INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO acct VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	locked := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var once [2]sync.Once
	fn := func(first, second int) mysqlstore.TxFunc {
		return func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
			runs.Add(1)
			if _, err := tx.ExecContext(ctx, "UPDATE acct SET bal = bal + 1 WHERE id = ?", first); err != nil {
				return nil, err
			}
			once[first-1].Do(func() {
				close(locked[first-1])
				select { // wait until the other holds its first row
				case <-locked[second-1]:
				case <-time.After(5 * time.Second):
				}
			})
			_, err := tx.ExecContext(ctx, "UPDATE acct SET bal = bal + 1 WHERE id = ?", second)
			return nil, err
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { _, errs[0] = s.DoTx(ctx, claimReq("a"), fn(1, 2)) })
	wg.Go(func() { _, errs[1] = s.DoTx(ctx, claimReq("b"), fn(2, 1)) })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var b1, b2 int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT bal FROM acct WHERE id = 1), (SELECT bal FROM acct WHERE id = 2)").Scan(&b1, &b2); err != nil {
		t.Fatal(err)
	}
	if b1 != 2 || b2 != 2 || runs.Load() < 3 {
		t.Fatalf("balances %d, %d after %d runs; want 2, 2 after at least 3 (one retry)", b1, b2, runs.Load())
	}
}

// ClaimTx in two caller transactions crossing two keys: the victim gets an
// error that IsRetryable and matches ErrUnavailable (nothing applied).
func TestClaimTxDeadlockIsRetryable(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	ctx := testCtx(t)
	tx1, _ := db.BeginTx(ctx, nil)
	tx2, _ := db.BeginTx(ctx, nil)
	defer tx1.Rollback()
	defer tx2.Rollback()
	if _, err := s.ClaimTx(ctx, tx1, claimReq("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimTx(ctx, tx2, claimReq("y")); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { _, err := s.ClaimTx(ctx, tx1, claimReq("y")); errs <- err }()
	time.Sleep(100 * time.Millisecond)
	go func() { _, err := s.ClaimTx(ctx, tx2, claimReq("x")); errs <- err }()
	var victim error
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			if victim == nil {
				victim = err // the first error is the deadlock victim's
			}
			// Roll the victim back so the survivor's wait ends.
			tx1.Rollback()
			tx2.Rollback()
		}
	}
	if !mysqlstore.IsRetryable(victim) || !errors.Is(victim, idem.ErrUnavailable) {
		t.Fatalf("deadlock victim error %v: want IsRetryable and ErrUnavailable", victim)
	}
}

// deadlockRig makes the next transaction that runs provoke lose a real
// deadlock against a second connection: the caller's tx holds acct row 1,
// the other transaction (made heavier with filler rows so that InnoDB picks
// the caller as the victim) holds row 2, then each asks for the other's.
type deadlockRig struct {
	db *sql.DB
}

func newDeadlockRig(t *testing.T, db *sql.DB) *deadlockRig {
	t.Helper()
	ctx := testCtx(t)
	for _, q := range []string{
		"CREATE TABLE acct (id INT PRIMARY KEY, bal INT NOT NULL) ENGINE=InnoDB",
		"INSERT INTO acct VALUES (1, 0), (2, 0)",
		"CREATE TABLE filler (id INT PRIMARY KEY) ENGINE=InnoDB",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return &deadlockRig{db: db}
}

// provoke runs "UPDATE acct ... id = 1" then "... id = 2" on tx while the
// other transaction takes them in the opposite order; it returns tx's
// error on the second update (1213 when tx was chosen as the victim). The
// other transaction rolls back once it has its locks.
func (r *deadlockRig) provoke(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, "UPDATE acct SET bal = bal + 1 WHERE id = 1"); err != nil {
		return err
	}
	other, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := other.ExecContext(ctx, "INSERT INTO filler SELECT seq FROM seq_1_to_200"); err != nil {
		other.Rollback()
		return err
	}
	if _, err := other.ExecContext(ctx, "UPDATE acct SET bal = bal + 10 WHERE id = 2"); err != nil {
		other.Rollback()
		return err
	}
	done := make(chan error, 1)
	go func() {
		_, err := other.ExecContext(ctx, "UPDATE acct SET bal = bal + 10 WHERE id = 1")
		other.Rollback()
		done <- err
	}()
	_, err = tx.ExecContext(ctx, "UPDATE acct SET bal = bal + 1 WHERE id = 2")
	if oerr := <-done; oerr != nil && err == nil {
		return fmt.Errorf("the other transaction lost the deadlock instead: %w", oerr)
	}
	return err
}

// retryingExec runs a statement and, after a deadlock, runs it again on
// the same tx, as an ORM or a careless handler does.
func retryingExec(ctx context.Context, tx *sql.Tx, deadlocks *atomic.Int32, q string, args ...any) error {
	_, err := tx.ExecContext(ctx, q, args...)
	if mysqlstore.IsRetryable(err) {
		deadlocks.Add(1)
		_, err = tx.ExecContext(ctx, q, args...)
	}
	return err
}

// A DoTx handler whose statement loses a deadlock (InnoDB rolls the whole
// transaction back, the claim included) and that retries the statement
// instead of returning the error. On 364ee14 the retry ran in autocommit
// and committed the effect at once, DoTx then found no claim to complete
// (ErrNotFound), and the redelivery acquired the key and ran the effect a
// second time. The effect must commit only with its record.
func TestDoTxHandlerRetriesAfterDeadlock(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	makeLedger(t, db)
	rig := newDeadlockRig(t, db)
	ctx := testCtx(t)
	var deadlocks, runs atomic.Int32
	fn := func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
		if runs.Add(1) == 1 {
			if err := rig.provoke(ctx, tx); err != nil {
				if !mysqlstore.IsRetryable(err) {
					return nil, err
				}
				deadlocks.Add(1)
				// The ORM retries the statement that failed, and goes on.
				if _, err := tx.ExecContext(ctx, "UPDATE acct SET bal = bal + 1 WHERE id = 2"); err != nil {
					return nil, err
				}
			}
		}
		if err := retryingExec(ctx, tx, &deadlocks, "INSERT INTO ledger (k) VALUES (?)", []byte("k")); err != nil {
			return nil, err
		}
		return []byte("r"), nil
	}
	c, err := s.DoTx(ctx, claimReq("k"), fn)
	if deadlocks.Load() == 0 {
		t.Fatal("the handler never lost a deadlock: the test did not test anything")
	}
	t.Logf("first delivery: %s, %v after %d runs; ledger %d", c.Outcome, err, runs.Load(), ledgerCount(t, db, "k"))
	if err != nil && ledgerCount(t, db, "k") != 0 {
		t.Fatalf("DoTx = %v, yet the effect committed (ledger %d): an effect without its record", err, ledgerCount(t, db, "k"))
	}
	// The redelivery.
	c, err = s.DoTx(ctx, claimReq("k"), appendLedger("k", "again"))
	if err != nil {
		t.Fatal(err)
	}
	if n := ledgerCount(t, db, "k"); n != 1 {
		t.Fatalf("ledger has %d rows for the key after the redelivery (%s): the effect ran %d times", n, c.Outcome, n)
	}
}

// autocommitOf reports @@autocommit of the pool's only connection.
func autocommitOf(t *testing.T, db *sql.DB) int {
	t.Helper()
	var ac int
	if err := db.QueryRowContext(testCtx(t), "SELECT @@autocommit").Scan(&ac); err != nil {
		t.Fatal(err)
	}
	return ac
}

// A handler that ends the transaction itself (a ROLLBACK statement, as a
// framework's error path might send) and carries on with its effect: the
// effect must not commit, on any attempt, and every path gives the pool
// its connection back in autocommit (one connection, so a leaked
// autocommit=0 session would be seen by the next caller).
func TestDoTxStatementsAfterTransactionEnd(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{TxRetries: 2})
	db.SetMaxOpenConns(1)
	makeLedger(t, db)
	ctx := testCtx(t)
	var runs atomic.Int32
	_, err := s.DoTx(ctx, claimReq("k"), func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
		runs.Add(1)
		if _, err := tx.ExecContext(ctx, "ROLLBACK"); err != nil {
			return nil, err
		}
		_, err := appendLedger("k", "")(ctx, tx, idem.Claim{})
		return nil, err
	})
	if !errors.Is(err, mysqlstore.ErrTxEnded) || !errors.Is(err, idem.ErrUnavailable) || !mysqlstore.IsRetryable(err) {
		t.Fatalf("DoTx = %v, want ErrTxEnded (ErrUnavailable, retryable)", err)
	}
	if runs.Load() != 3 {
		t.Fatalf("fn ran %d times, want 3 (TxRetries 2)", runs.Load())
	}
	if n := ledgerCount(t, db, "k"); n != 0 {
		t.Fatalf("ledger %d: an effect committed without its record", n)
	}
	if ac := autocommitOf(t, db); ac != 1 {
		t.Fatalf("@@autocommit = %d on the pool's connection after DoTx", ac)
	}
	if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record: %v", err)
	}
	// Every other way out of DoTx leaves autocommit on too.
	for name, fn := range map[string]mysqlstore.TxFunc{
		"acquired":  appendLedger("k", "r"),
		"duplicate": appendLedger("k", "r"),
		"error": func(context.Context, *sql.Tx, idem.Claim) ([]byte, error) {
			return nil, errors.New("boom")
		},
	} {
		key := "k"
		if name == "error" {
			key = "e"
		}
		if _, err := s.DoTx(ctx, claimReq(key), fn); (err != nil) != (name == "error") {
			t.Fatalf("%s: %v", name, err)
		}
		if ac := autocommitOf(t, db); ac != 1 {
			t.Fatalf("%s: @@autocommit = %d on the pool's connection after DoTx", name, ac)
		}
	}
	if n := ledgerCount(t, db, "k"); n != 1 {
		t.Fatalf("ledger %d, want 1", n)
	}
}

// ClaimTx + CompleteTx on a Store.BeginTx transaction whose effect loses a
// real deadlock and is retried statement by statement (and whose caller
// ignores CompleteTx's error): Commit refuses, nothing commits, and the
// whole transaction run again commits once.
func TestBeginTxEffectRetriedAfterDeadlock(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	makeLedger(t, db)
	rig := newDeadlockRig(t, db)
	ctx := testCtx(t)
	var deadlocks atomic.Int32
	run := func(provoke bool) error {
		tx, err := s.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		c, err := s.ClaimTx(ctx, tx.Tx, claimReq("k"))
		if err != nil || c.Outcome != idem.OutcomeAcquired {
			return fmt.Errorf("ClaimTx = %s, %v", c.Outcome, err)
		}
		if provoke {
			if err := rig.provoke(ctx, tx.Tx); err != nil {
				if !mysqlstore.IsRetryable(err) {
					return err
				}
				deadlocks.Add(1)
				if _, err := tx.ExecContext(ctx, "UPDATE acct SET bal = bal + 1 WHERE id = 2"); err != nil {
					return err
				}
			}
		}
		if err := retryingExec(ctx, tx.Tx, &deadlocks, "INSERT INTO ledger (k) VALUES (?)", []byte("k")); err != nil {
			return err
		}
		_ = s.CompleteTx(ctx, tx.Tx, []byte("k"), c.Record.Token, []byte("r")) // error ignored
		return tx.Commit()
	}
	err := run(true)
	if deadlocks.Load() == 0 {
		t.Fatal("the effect never lost a deadlock: the test did not test anything")
	}
	if !errors.Is(err, mysqlstore.ErrTxEnded) || !mysqlstore.IsRetryable(err) {
		t.Fatalf("Commit after the server ended the transaction = %v, want ErrTxEnded", err)
	}
	if n := ledgerCount(t, db, "k"); n != 0 {
		t.Fatalf("ledger %d after the refused commit: an effect without its record", n)
	}
	if err := run(false); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, []byte("k")); err != nil || r.State != idem.StateCompleted || ledgerCount(t, db, "k") != 1 {
		t.Fatalf("after the rerun: %+v, %v, ledger %d", r, err, ledgerCount(t, db, "k"))
	}
}
