package mysqlstore_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// waitFirstPartitionDroppable sleeps until the first partition (everything
// before today, UTC) is past a one-minute Retention.
func waitFirstPartitionDroppable() {
	if wait := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(time.Minute + time.Second)); wait > 0 {
		time.Sleep(wait)
	}
}

// waitForBlockedSession polls until a session other than the caller's is
// blocked in the test database: waiting for a table's metadata lock (an
// ALTER or LOCK TABLES behind an open transaction) or running a statement
// for more than 300 ms (waiting for a row lock: INNODB_TRX is a cache that
// does not always show the wait).
func waitForBlockedSession(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := testCtx(t)
	for i := 0; ; i++ {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()
 AND (STATE LIKE 'Waiting for table metadata lock%' OR (COMMAND = 'Query' AND TIME_MS > 300))`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if i > 300 {
			rows, _ := db.QueryContext(ctx, "SELECT CONCAT_WS(' | ', ID, DB, COMMAND, STATE, LEFT(INFO, 80)) FROM information_schema.PROCESSLIST")
			for rows != nil && rows.Next() {
				var l string
				rows.Scan(&l)
				t.Log(l)
			}
			t.Fatal("maintenance never blocked behind the open transaction")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A claim of an old UUIDv7 key (it lands in the oldest partition) made by
// ClaimTx in a transaction that is still open when DropExpiredPartitions
// starts, and committed (with CompleteTx) while the drop waits for the
// table: the record is live, so the partition must stay, and a duplicate
// must be answered from it rather than acquired again. On 364ee14 the
// "no live row" check ran before the commit and the DROP after it: the
// completed record was dropped and its duplicate acquired.
func TestDropPartitionKeepsClaimCommittedDuringDrop(t *testing.T) {
	for _, archive := range []bool{false, true} {
		name := "plain"
		if archive {
			name = "archive"
		}
		t.Run(name, func(t *testing.T) {
			s, db := newStore(t, mysqlstore.Config{Layout: mysqlstore.LayoutTimePartitioned, KeyTime: mysqlstore.UUIDv7KeyTime,
				Retention: time.Minute, LockTimeout: time.Minute, Archive: archive})
			ctx := testCtx(t)
			waitFirstPartitionDroppable()
			key := uuidv7(time.Now().Add(-72*time.Hour), 1)
			req := idem.ClaimRequest{Key: key, Lease: time.Minute, TTL: time.Hour}

			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			c, err := s.ClaimTx(ctx, tx, req)
			if err != nil || c.Outcome != idem.OutcomeAcquired {
				t.Fatalf("ClaimTx = %+v, %v", c, err)
			}
			type dropResult struct {
				dropped []string
				err     error
			}
			done := make(chan dropResult, 1)
			go func() {
				d, err := s.DropExpiredPartitions(ctx)
				done <- dropResult{d, err}
			}()
			waitForBlockedSession(t, db) // the drop waits for our transaction
			if err := s.CompleteTx(ctx, tx, key, c.Record.Token, []byte("effect")); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			res := <-done
			if res.err != nil {
				t.Fatal(res.err)
			}
			r, err := s.Get(ctx, key)
			if err != nil {
				t.Fatalf("record committed during the drop: Get = %v (dropped %v): a live record was removed", err, res.dropped)
			}
			if r.State != idem.StateCompleted || r.Token != c.Record.Token {
				t.Fatalf("record after the drop: %+v", r)
			}
			dup, err := s.Claim(ctx, req)
			if err != nil || dup.Outcome != idem.OutcomeCompleted || string(dup.Record.Result) != "effect" {
				t.Fatalf("duplicate after the drop = %s %+v, %v; want completed with the first result", dup.Outcome, dup.Record, err)
			}
			if len(res.dropped) != 0 {
				t.Fatalf("dropped %v although it holds a live record", res.dropped)
			}
			// Once the record is gone the partition goes (and, with Archive,
			// its rows reach the history table).
			if err := s.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			d, err := s.DropExpiredPartitions(ctx)
			if err != nil || len(d) != 1 {
				t.Fatalf("DropExpiredPartitions of an empty old partition = %v, %v", d, err)
			}
		})
	}
}

// Maintenance from two Store values at once (as from two processes): each
// round re-reads the partitions under the maintenance lock, so neither
// fails on a partition the other just added or dropped.
func TestMaintenanceConcurrentStores(t *testing.T) {
	cfg := mysqlstore.Config{Layout: mysqlstore.LayoutTimePartitioned, KeyTime: mysqlstore.UUIDv7KeyTime, Retention: time.Minute, Precreate: 1, Archive: true}
	s1, db := newStore(t, cfg)
	cfg.DB = db
	s2, err := mysqlstore.Open(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ctx := testCtx(t)
	waitFirstPartitionDroppable()
	errs := make(chan error, 2)
	for _, s := range []*mysqlstore.Store{s1, s2} {
		go func() {
			var err error
			for i := 0; i < 10 && err == nil; i++ {
				if _, err = s.EnsurePartitions(ctx); err == nil {
					_, err = s.DropExpiredPartitions(ctx)
				}
			}
			errs <- err
		}()
	}
	if err := errors.Join(<-errs, <-errs); err != nil {
		t.Fatal(err)
	}
}
