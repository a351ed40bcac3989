package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
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
