package pgstore_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

// claimPath is one way of claiming a key that inserts a record. DoTx
// completes it in the same transaction; the others leave it in progress.
type claimPath struct {
	name  string
	claim func(ctx context.Context, s *pgstore.Store, cfg pgstore.Config, req idem.ClaimRequest) (idem.Claim, error)
}

// inTx runs fn in a transaction of cfg.Pool and commits it. A transaction
// that fails with a retryable error (the server aborted it; pgstore says so
// with ErrUnavailable and IsRetryable) is run again, once: a caller's
// transaction cannot be repaired from inside, but the next one must succeed.
func inTx(ctx context.Context, cfg pgstore.Config, fn func(tx pgx.Tx) (idem.Claim, error)) (idem.Claim, error) {
	for attempt := 0; ; attempt++ {
		tx, err := cfg.Pool.Begin(ctx)
		if err != nil {
			return idem.Claim{}, err
		}
		c, err := fn(tx)
		if err == nil {
			return c, tx.Commit(ctx)
		}
		_ = tx.Rollback(ctx)
		if attempt > 0 || !errors.Is(err, idem.ErrUnavailable) {
			return c, err
		}
		if !pgstore.IsRetryable(err) {
			return c, fmt.Errorf("not IsRetryable: %w", err)
		}
	}
}

var claimPaths = []claimPath{
	{"Claim", func(ctx context.Context, s *pgstore.Store, _ pgstore.Config, req idem.ClaimRequest) (idem.Claim, error) {
		return s.Claim(ctx, req)
	}},
	{"ClaimBatch", func(ctx context.Context, s *pgstore.Store, _ pgstore.Config, req idem.ClaimRequest) (idem.Claim, error) {
		res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{req})
		if err != nil {
			return idem.Claim{}, err
		}
		return res[0].Claim, res[0].Err
	}},
	{"ClaimTx", func(ctx context.Context, s *pgstore.Store, cfg pgstore.Config, req idem.ClaimRequest) (idem.Claim, error) {
		return inTx(ctx, cfg, func(tx pgx.Tx) (idem.Claim, error) { return s.ClaimTx(ctx, tx, req) })
	}},
	{"ClaimBatchTx", func(ctx context.Context, s *pgstore.Store, cfg pgstore.Config, req idem.ClaimRequest) (idem.Claim, error) {
		return inTx(ctx, cfg, func(tx pgx.Tx) (idem.Claim, error) {
			res, err := s.ClaimBatchTx(ctx, tx, []idem.ClaimRequest{req})
			if err != nil {
				return idem.Claim{}, err
			}
			return res[0].Claim, res[0].Err
		})
	}},
	{"DoTx", func(ctx context.Context, s *pgstore.Store, _ pgstore.Config, req idem.ClaimRequest) (idem.Claim, error) {
		return s.DoTx(ctx, req, func(context.Context, pgx.Tx, idem.Claim) ([]byte, error) {
			return []byte("done"), nil
		})
	}},
}

// oldDay is the start of the day n days before today (UTC).
func oldDay(n int) time.Time {
	return time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -n)
}

func partitionedConfig(t *testing.T) pgstore.Config {
	p := sharedPool(t)
	return pgstore.Config{Pool: p, Schema: testSchema(t, p), Table: "pt", Layout: pgstore.LayoutTimePartitioned,
		KeyTime: pgstore.UUIDv7KeyTime, Precreate: 1, Namespace: "drop"}
}

// TestPartitionDroppedByAnotherStore: one Store value drops a partition
// that another Store value has used (and remembers as existing). The keys
// of that period are absent, so every claim path of the other Store value
// must acquire them: it recreates the partition.
func TestPartitionDroppedByAnotherStore(t *testing.T) {
	cfg := partitionedConfig(t)
	openStore(t, cfg)
	dropper, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testPartitionDropped(t, cfg, func(ctx context.Context) ([]string, error) {
		return dropper.DropExpiredPartitions(ctx)
	})
}

// TestPartitionDroppedByAnotherProcess is the same with the partitions
// dropped by another process (this test binary run again as a child).
func TestPartitionDroppedByAnotherProcess(t *testing.T) {
	cfg := partitionedConfig(t)
	openStore(t, cfg)
	testPartitionDropped(t, cfg, func(ctx context.Context) ([]string, error) {
		out := runChild(t, "drop", cfg)
		var dropped []string
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if name, ok := strings.CutPrefix(sc.Text(), "DROPPED "); ok {
				dropped = append(dropped, name)
			}
		}
		return dropped, nil
	})
}

func testPartitionDropped(t *testing.T, cfg pgstore.Config, drop func(context.Context) ([]string, error)) {
	ctx := ctxT(t)
	// One old day and one Store value per path. The path's Store uses its
	// day's partition (which creates it and caches it as existing), then
	// the record is deleted: the partition holds no live record and may be
	// dropped.
	claimers := make([]*pgstore.Store, len(claimPaths))
	for i := range claimPaths {
		claimer, err := pgstore.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		claimers[i] = claimer
		k := uuid7(oldDay(10+i).Add(time.Hour), 0)
		c, err := claimer.Claim(ctx, idem.ClaimRequest{Key: k, Lease: time.Minute, TTL: time.Hour})
		if err != nil || c.Outcome != idem.OutcomeAcquired {
			t.Fatalf("priming claim: %+v, %v", c, err)
		}
		if err := claimer.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	dropped, err := drop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range claimPaths {
		name := "pt_p" + oldDay(10+i).Format("20060102")
		if !slices.Contains(dropped, name) {
			t.Fatalf("partition %s not dropped (dropped %v): the test no longer covers a dropped partition", name, dropped)
		}
	}
	for i, p := range claimPaths {
		t.Run(p.name, func(t *testing.T) {
			k := uuid7(oldDay(10+i).Add(2*time.Hour), 1)
			claimer := claimers[i]
			c, err := p.claim(ctx, claimer, cfg, idem.ClaimRequest{Key: k, Lease: time.Minute, TTL: time.Hour})
			if err != nil || c.Outcome != idem.OutcomeAcquired {
				t.Fatalf("claim of an absent key whose partition was dropped elsewhere: %s, %v; want acquired", c.Outcome, err)
			}
			rec, err := claimer.Get(ctx, k)
			if err != nil || rec.Token != c.Record.Token {
				t.Fatalf("record after the claim: %+v, %v; want token %d", rec, err, c.Record.Token)
			}
		})
	}
}

// Child processes: TestChildProcess does what PGSTORE_CHILD says on the
// schema and table the parent passes, and prints its results on stdout.
const childEnv = "PGSTORE_CHILD"

func runChild(t *testing.T, op string, cfg pgstore.Config, extra ...string) []byte {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+op, "PGSTORE_CHILD_SCHEMA="+cfg.Schema, "PGSTORE_CHILD_TABLE="+cfg.Table,
		"PGSTORE_CHILD_NS="+cfg.Namespace)
	cmd.Env = append(cmd.Env, extra...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", op, err, out)
	}
	return out
}

func TestChildProcess(t *testing.T) {
	op := os.Getenv(childEnv)
	if op == "" {
		t.Skip("run by the tests that need a second process")
	}
	p := sharedPool(t)
	cfg := pgstore.Config{Pool: p, Schema: os.Getenv("PGSTORE_CHILD_SCHEMA"), Table: os.Getenv("PGSTORE_CHILD_TABLE"),
		Layout: pgstore.LayoutTimePartitioned, KeyTime: pgstore.UUIDv7KeyTime, Precreate: 1, Namespace: os.Getenv("PGSTORE_CHILD_NS")}
	s, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch op {
	case "drop":
		dropped, err := s.DropExpiredPartitions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range dropped {
			fmt.Printf("DROPPED %s\n", name)
		}
	case "maintain":
		childMaintain(t, s)
	default:
		t.Fatalf("unknown child op %q", op)
	}
}
