package mysqlstore_test

import (
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
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

// maintChildEnv names the database a TestMaintenanceProcessChild run
// maintains; without it that test is only the parent's helper and skips.
const maintChildEnv = "IDEM_MYSQL_MAINT_CHILD_DB"

// maintProcCfg is the configuration both processes of
// TestMaintenanceFromAnotherProcess use.
func maintProcCfg(db *sql.DB) mysqlstore.Config {
	return mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutTimePartitioned, KeyTime: mysqlstore.UUIDv7KeyTime,
		Retention: time.Minute, Archive: true}
}

// TestMaintenanceProcessChild is the maintenance process of
// TestMaintenanceFromAnotherProcess: Purge, EnsurePartitions and
// DropExpiredPartitions in a loop until its stdin closes, then one line
// "rounds N dropped M".
func TestMaintenanceProcessChild(t *testing.T) {
	name := os.Getenv(maintChildEnv)
	if name == "" {
		t.Skip("helper process of TestMaintenanceFromAnotherProcess")
	}
	db, err := sql.Open("mysql", dsn(serverAddr(), name))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := mysqlstore.Open(testCtx(t), maintProcCfg(db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	ctx := testCtx(t)
	rounds, dropped := 0, 0
	for {
		select {
		case <-stop:
			fmt.Printf("rounds %d dropped %d\n", rounds, dropped)
			return
		default:
		}
		if _, err := s.Purge(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.EnsurePartitions(ctx); err != nil {
			t.Fatal(err)
		}
		d, err := s.DropExpiredPartitions(ctx)
		if err != nil && !errors.Is(err, idem.ErrUnavailable) { // a lock wait longer than LockTimeout
			t.Fatal(err)
		}
		rounds++
		dropped += len(d)
	}
}

// Maintenance in another process, in a tight loop, while this one claims
// keys of five old daily partitions: short-lived records (so the
// partitions become droppable) and, in four of them, a key claimed late by
// ClaimTx, held open a while, then completed and committed (so some drops
// race an open transaction, some come before the claim, which then lands
// in a newer partition). Every late record must survive, and claiming it
// again must replay it. The first partition gets no late key, so at least
// one partition is dropped while this runs (checked).
func TestMaintenanceFromAnotherProcess(t *testing.T) {
	name, db := newDB(t)
	ctx := testCtx(t)
	if err := mysqlstore.Migrate(ctx, maintProcCfg(db)); err != nil {
		t.Fatal(err)
	}
	s, err := mysqlstore.Open(ctx, maintProcCfg(db))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitFirstPartitionDroppable()
	// Split "everything before today" into daily partitions for the last
	// five days.
	today := time.Now().UTC().Truncate(24 * time.Hour)
	var defs []string
	for d := 5; d >= 0; d-- {
		b := today.Add(-time.Duration(d) * 24 * time.Hour)
		defs = append(defs, fmt.Sprintf("PARTITION p_lt_%s VALUES LESS THAN (%d)", b.Format("20060102"), b.UnixMicro()))
	}
	if _, err := db.ExecContext(ctx, "ALTER TABLE idem_records REORGANIZE PARTITION p_lt_"+today.Format("20060102")+" INTO ("+strings.Join(defs, ", ")+")"); err != nil {
		t.Fatal(err)
	}
	countParts := func() int {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idem_records'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := countParts()

	child := exec.Command(os.Args[0], "-test.run=^TestMaintenanceProcessChild$", "-test.count=1")
	child.Env = append(os.Environ(), maintChildEnv+"="+name)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	childDone := false
	defer func() {
		if !childDone {
			stdin.Close()
			child.Wait()
		}
	}()

	type late struct {
		key   []byte
		token uint64
	}
	lates := make([]late, 5)
	errs := make(chan error, 5)
	var wg sync.WaitGroup
	for p := 0; p < 5; p++ {
		day := today.Add(-time.Duration(5-p) * 24 * time.Hour).Add(12 * time.Hour) // inside partition p+1
		wg.Go(func() {
			for n := 0; n < 6; n++ {
				c, err := s.Claim(ctx, idem.ClaimRequest{Key: uuidv7(day, byte(n)), Lease: 100 * time.Millisecond, TTL: 200 * time.Millisecond})
				if err != nil {
					errs <- err
					return
				}
				if n%2 == 0 {
					if err := s.Complete(ctx, uuidv7(day, byte(n)), c.Record.Token, nil); err != nil && !errors.Is(err, idem.ErrNotFound) {
						errs <- err
						return
					}
				}
			}
			if p == 0 {
				return // this partition only holds short records: it must go
			}
			time.Sleep(time.Duration(p) * 120 * time.Millisecond) // before, around and after the short records expire
			key := uuidv7(day, 100)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				errs <- err
				return
			}
			defer tx.Rollback()
			c, err := s.ClaimTx(ctx, tx, idem.ClaimRequest{Key: key, Lease: time.Minute, TTL: time.Hour})
			if err != nil || c.Outcome != idem.OutcomeAcquired {
				errs <- fmt.Errorf("late ClaimTx = %s, %v", c.Outcome, err)
				return
			}
			time.Sleep(300 * time.Millisecond) // open while maintenance runs
			if err := s.CompleteTx(ctx, tx, key, c.Record.Token, key); err != nil {
				errs <- err
				return
			}
			if err := tx.Commit(); err != nil {
				errs <- err
				return
			}
			lates[p] = late{key, c.Record.Token}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Maintenance must have dropped something while we ran (at least the
	// first partition once its records expired).
	for i := 0; countParts() == before; i++ {
		if i > 600 {
			stdin.Close()
			child.Wait()
			childDone = true
			t.Fatalf("the maintenance process dropped nothing in a minute; its output:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	stdin.Close()
	err = child.Wait()
	childDone = true
	if err != nil {
		t.Fatalf("maintenance process: %v\n%s", err, out.String())
	}
	t.Logf("maintenance process: %s; partitions %d -> %d", strings.TrimSpace(lastLine(out.String())), before, countParts())
	for p, l := range lates[1:] {
		r, err := s.Get(ctx, l.key)
		if err != nil || r.State != idem.StateCompleted || r.Token != l.token {
			t.Fatalf("late record of partition %d: %+v, %v; want completed with token %d (removed by maintenance?)", p+1, r, err, l.token)
		}
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: l.key, Lease: time.Minute, TTL: time.Hour})
		if err != nil || c.Outcome != idem.OutcomeCompleted {
			t.Fatalf("duplicate of the late record of partition %d = %s, %v; want a replay", p+1, c.Outcome, err)
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "rounds ") {
			return lines[i]
		}
	}
	return lines[len(lines)-1]
}
