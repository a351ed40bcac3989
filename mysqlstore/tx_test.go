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

// ledger is a table with NO unique constraint: the effect of DoTx appends a
// row, so a double effect shows up as two rows.
func makeLedger(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(testCtx(t), "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARBINARY(1024) NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
}

func ledgerCount(t *testing.T, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(testCtx(t), "SELECT COUNT(*) FROM ledger WHERE k = ?", []byte(key)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func appendLedger(key string, result string) mysqlstore.TxFunc {
	return func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
		if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (k) VALUES (?)", []byte(key)); err != nil {
			return nil, err
		}
		return []byte(result), nil
	}
}

func claimReq(key string) idem.ClaimRequest {
	return idem.ClaimRequest{Key: []byte(key), Lease: time.Minute, TTL: time.Hour}
}

func TestDoTxOnceAndReplay(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	makeLedger(t, db)
	ctx := testCtx(t)
	c, err := s.DoTx(ctx, claimReq("order-1"), appendLedger("order-1", "r1"))
	if err != nil || c.Outcome != idem.OutcomeAcquired || string(c.Record.Result) != "r1" || c.Record.State != idem.StateCompleted {
		t.Fatalf("first DoTx = %+v, %v", c, err)
	}
	c2, err := s.DoTx(ctx, claimReq("order-1"), func(context.Context, *sql.Tx, idem.Claim) ([]byte, error) {
		t.Fatal("effect ran for a duplicate")
		return nil, nil
	})
	if err != nil || c2.Outcome != idem.OutcomeCompleted || string(c2.Record.Result) != "r1" || c2.Record.Token != c.Record.Token {
		t.Fatalf("duplicate DoTx = %+v, %v", c2, err)
	}
	if n := ledgerCount(t, db, "order-1"); n != 1 {
		t.Fatalf("ledger has %d rows, want 1", n)
	}
	rec, err := s.Get(ctx, []byte("order-1"))
	if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "r1" {
		t.Fatalf("Get = %+v, %v", rec, err)
	}
}

func TestDoTxRollbackLeavesNothing(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	makeLedger(t, db)
	ctx := testCtx(t)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		fn   mysqlstore.TxFunc
	}{
		{"error", func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
			if _, err := appendLedger("k", "")(ctx, tx, idem.Claim{}); err != nil {
				return nil, err
			}
			return nil, boom
		}},
		{"panic", func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
			_, _ = appendLedger("k", "")(ctx, tx, idem.Claim{})
			panic("handler panic")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.DoTx(ctx, claimReq("k"), tc.fn)
			var he *idem.HandlerError
			if !errors.As(err, &he) {
				t.Fatalf("err = %v, want *idem.HandlerError", err)
			}
			if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("record after rollback: %v", err)
			}
			if n := ledgerCount(t, db, "k"); n != 0 {
				t.Fatalf("ledger rows after rollback: %d", n)
			}
		})
	}
	// The key is free: the next run acquires it.
	c, err := s.DoTx(ctx, claimReq("k"), appendLedger("k", "ok"))
	if err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("DoTx after rollbacks = %+v, %v", c, err)
	}
}

// Many concurrent DoTx on one key: exactly one effect; the others wait for
// the row lock and then replay the result.
func TestDoTxConcurrentDuplicates(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	makeLedger(t, db)
	ctx := testCtx(t)
	const n = 16
	var ran atomic.Int32
	var wg sync.WaitGroup
	outcomes := make([]idem.Outcome, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Go(func() {
			c, err := s.DoTx(ctx, claimReq("hot"), func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
				ran.Add(1)
				time.Sleep(20 * time.Millisecond) // hold the row lock a while
				return appendLedger("hot", "once")(ctx, tx, idem.Claim{})
			})
			outcomes[i], errs[i] = c.Outcome, err
		})
	}
	wg.Wait()
	acq := 0
	for i := range outcomes {
		switch {
		case errs[i] != nil:
			t.Errorf("DoTx %d: %v", i, errs[i])
		case outcomes[i] == idem.OutcomeAcquired:
			acq++
		case outcomes[i] != idem.OutcomeCompleted:
			t.Errorf("DoTx %d: outcome %s", i, outcomes[i])
		}
	}
	if acq != 1 || ran.Load() != 1 || ledgerCount(t, db, "hot") != 1 {
		t.Fatalf("acquired %d, effect ran %d, ledger %d; want 1, 1, 1", acq, ran.Load(), ledgerCount(t, db, "hot"))
	}
}

// A standalone claim holding a live lease makes DoTx report in progress; a
// DoTx holding the row lock makes a standalone Claim wait and then see
// the completed record (or, with LockWait, in progress).
func TestDoTxVersusStandalone(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{})
	makeLedger(t, db)
	ctx := testCtx(t)
	if _, err := s.Claim(ctx, claimReq("held")); err != nil {
		t.Fatal(err)
	}
	_, err := s.DoTx(ctx, claimReq("held"), appendLedger("held", ""))
	var ip *idem.InProgressError
	if !errors.As(err, &ip) || !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("DoTx on a held key: %v", err)
	}
	if n := ledgerCount(t, db, "held"); n != 0 {
		t.Fatalf("effect ran on a held key")
	}

	inFn := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := s.DoTx(ctx, claimReq("tx-key"), func(ctx context.Context, tx *sql.Tx, _ idem.Claim) ([]byte, error) {
			close(inFn)
			<-release
			return appendLedger("tx-key", "from-tx")(ctx, tx, idem.Claim{})
		})
		done <- err
	}()
	<-inFn
	got := make(chan idem.Claim, 1)
	go func() {
		c, err := s.Claim(ctx, claimReq("tx-key"))
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	time.Sleep(100 * time.Millisecond) // the Claim is now waiting on the row lock
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c := <-got; c.Outcome != idem.OutcomeCompleted || string(c.Record.Result) != "from-tx" {
		t.Fatalf("standalone claim behind DoTx = %+v", c)
	}
}

func TestClaimLockWaitReportsInProgress(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{LockWait: time.Second})
	makeLedger(t, db)
	ctx := testCtx(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if c, err := s.ClaimTx(ctx, tx, claimReq("locked")); err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("ClaimTx = %+v, %v", c, err)
	}
	_, err = s.Claim(ctx, claimReq("locked"))
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Claim on a row locked by a transaction: %v, want ErrInProgress", err)
	}
	res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{claimReq("locked")})
	if !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("ClaimBatch on a locked row: %v %v, want ErrUnavailable", res, err)
	}
	// The same with the statement's rows in a derived table (SET STATEMENT
	// ... FOR INSERT ... WITH ... SELECT).
	mysqlstore.SetDerivedMin(s, 1)
	if _, err = s.Claim(ctx, claimReq("locked")); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Claim (derived rows) on a row locked by a transaction: %v, want ErrInProgress", err)
	}
	res, err = s.ClaimBatch(ctx, []idem.ClaimRequest{claimReq("locked"), claimReq("free")})
	if !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("ClaimBatch (derived rows) on a locked row: %v %v, want ErrUnavailable", res, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Claim(ctx, claimReq("locked")); err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("Claim after rollback = %+v, %v", c, err)
	}
}

// txEnder is how a test ends a transaction from DB.BeginTx or Store.BeginTx.
type txEnder interface {
	Commit() error
	Rollback() error
}

// ClaimTx + CompleteTx inside the caller's own transaction, begun by
// DB.BeginTx or by Store.BeginTx (whose connection must go back to the
// pool in autocommit: the pool has one connection, so a leak would show).
func TestClaimTxCompleteTx(t *testing.T) {
	for _, viaStore := range []bool{false, true} {
		name := "DB.BeginTx"
		if viaStore {
			name = "Store.BeginTx"
		}
		t.Run(name, func(t *testing.T) { testClaimTxCompleteTx(t, viaStore) })
	}
}

func testClaimTxCompleteTx(t *testing.T, viaStore bool) {
	s, db := newStore(t, mysqlstore.Config{})
	makeLedger(t, db)
	ctx := testCtx(t)
	begin := func() (*sql.Tx, txEnder) {
		t.Helper()
		if viaStore {
			tx, err := s.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx.Tx, tx
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tx, tx
	}
	ended := func(end txEnder) {
		t.Helper()
		if !viaStore {
			return
		}
		if err := end.Commit(); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("Commit after the end: %v", err)
		}
		if err := end.Rollback(); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("Rollback after the end: %v", err)
		}
		if ac := autocommitOf(t, db); ac != 1 {
			t.Fatalf("@@autocommit = %d on the pool's connection after the Tx", ac)
		}
	}
	if viaStore {
		db.SetMaxOpenConns(1)
	}
	for i, commit := range []bool{false, true} {
		tx, end := begin()
		c, err := s.ClaimTx(ctx, tx, claimReq("own"))
		if err != nil || c.Outcome != idem.OutcomeAcquired {
			t.Fatalf("ClaimTx = %+v, %v", c, err)
		}
		if _, err := appendLedger("own", "")(ctx, tx, idem.Claim{}); err != nil {
			t.Fatal(err)
		}
		if err := s.CompleteTx(ctx, tx, []byte("own"), c.Record.Token, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = end.Commit()
		} else {
			err = end.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		ended(end)
	}
	rec, err := s.Get(ctx, []byte("own"))
	if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "1" || ledgerCount(t, db, "own") != 1 {
		t.Fatalf("after rollback then commit: %+v %v ledger=%d", rec, err, ledgerCount(t, db, "own"))
	}
	// A batch inside the caller's transaction: one acquired key completed,
	// one released, then rolled back: nothing remains. Twice: with the rows
	// in a VALUES list, then in a derived table (ON DUPLICATE KEY UPDATE
	// over INSERT ... SELECT).
	for _, derived := range []bool{false, true} {
		if derived {
			mysqlstore.SetDerivedMin(s, 1)
		}
		tx, end := begin()
		res, err := s.ClaimBatchTx(ctx, tx, []idem.ClaimRequest{claimReq("b1"), claimReq("b2"), claimReq("own"), claimReq("b1")})
		if err != nil || res[0].Claim.Outcome != idem.OutcomeAcquired || res[1].Claim.Outcome != idem.OutcomeAcquired ||
			res[2].Claim.Outcome != idem.OutcomeCompleted || res[3].Claim.Outcome != idem.OutcomeInProgress {
			t.Fatalf("ClaimBatchTx = %+v, %v", res, err)
		}
		if err := s.CompleteTx(ctx, tx, []byte("b1"), res[0].Claim.Record.Token, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.ReleaseTx(ctx, tx, []byte("b2"), res[1].Claim.Record.Token, "later"); err != nil {
			t.Fatal(err)
		}
		if err := end.Rollback(); err != nil {
			t.Fatal(err)
		}
		ended(end)
		for _, k := range []string{"b1", "b2"} {
			if _, err := s.Get(ctx, []byte(k)); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("%s after rollback: %v", k, err)
			}
		}
	}
	if _, err := s.ClaimTx(ctx, nil, claimReq("x")); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("nil tx: %v", err)
	}
}
