package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestBatchRepeatedKeys checks that a batch equals claims one after another,
// including the repeat that must take a released key over after an earlier
// entry of the same batch was refused for its fingerprint.
func TestBatchRepeatedKeys(t *testing.T) {
	for _, lc := range layouts {
		t.Run(lc.name, func(t *testing.T) {
			s, _ := newStore(t, lc, "batch")
			ctx := ctxT(t)
			fp := func(k, f string) idem.ClaimRequest { r := claimReq(k); r.Fingerprint = []byte(f); return r }
			c, err := s.Claim(ctx, fp("rel", "x"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, []byte("rel"), c.Record.Token, "retry"); err != nil {
				t.Fatal(err)
			}
			reqs := []idem.ClaimRequest{
				fp("a", "x"), fp("a", "x"), fp("a", "y"), claimReq("b"),
				{Key: nil, Lease: time.Second, TTL: time.Second},
				fp("rel", "y"), fp("rel", "x"), fp("rel", ""),
			}
			res, err := s.ClaimBatch(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			want := []struct {
				out idem.Outcome
				err error
			}{
				{idem.OutcomeAcquired, nil}, {idem.OutcomeInProgress, nil}, {0, idem.ErrFingerprintMismatch}, {idem.OutcomeAcquired, nil},
				{0, idem.ErrInvalidKey},
				{0, idem.ErrFingerprintMismatch}, {idem.OutcomeAcquired, nil}, {idem.OutcomeInProgress, nil},
			}
			for i, w := range want {
				if w.err != nil {
					if !errors.Is(res[i].Err, w.err) {
						t.Errorf("entry %d: err %v, want %v", i, res[i].Err, w.err)
					}
					continue
				}
				if res[i].Err != nil || res[i].Claim.Outcome != w.out {
					t.Errorf("entry %d: %s, %v; want %s", i, res[i].Claim.Outcome, res[i].Err, w.out)
				}
			}
			if res[6].Claim.Record.Token <= c.Record.Token || res[6].Claim.Record.Attempts != 2 {
				t.Errorf("takeover in batch: token %d (was %d), attempts %d", res[6].Claim.Record.Token, c.Record.Token, res[6].Claim.Record.Attempts)
			}
			if res[1].Claim.Record.Token != res[0].Claim.Record.Token {
				t.Errorf("repeat reports token %d, holder has %d", res[1].Claim.Record.Token, res[0].Claim.Record.Token)
			}
		})
	}
}

// TestBatchConcurrentOverlap runs overlapping batches at once: every key is
// acquired exactly once, none deadlocks.
func TestBatchConcurrentOverlap(t *testing.T) {
	s, _ := newStore(t, layouts[1], "overlap")
	const workers, keys = 8, 200
	var mu sync.Mutex
	acquired := map[string]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]idem.ClaimRequest, keys)
			for i := range keys {
				// each worker walks the keys in a different order
				reqs[i] = claimReq("k" + string(rune('A'+(i*(w+1)+w)%keys%26)) + string(rune('a'+(i*(w+1)+w)%keys/26)))
			}
			res, err := s.ClaimBatch(ctxT(t), reqs)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, r := range res {
				if r.Err != nil {
					t.Error(r.Err)
				}
				if r.Claim.Outcome == idem.OutcomeAcquired {
					acquired[string(reqs[i].Key)]++
				}
			}
		}()
	}
	wg.Wait()
	for k, n := range acquired {
		if n != 1 {
			t.Errorf("key %s acquired %d times", k, n)
		}
	}
	if len(acquired) == 0 {
		t.Fatal("nothing acquired")
	}
}

// TestInvalidInputBeforeSQL uses a pool that points nowhere: any SQL would
// fail with ErrUnavailable, so the validation errors prove no SQL ran.
func TestInvalidInputBeforeSQL(t *testing.T) {
	p, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	single, err := pgstore.New(pgstore.Config{Pool: p})
	if err != nil {
		t.Fatal(err)
	}
	timed, err := pgstore.New(pgstore.Config{Pool: p, Layout: pgstore.LayoutTimeOrdered, KeyTime: pgstore.UUIDv7KeyTime})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	long := bytes.Repeat([]byte{'k'}, idem.MaxKeyLen+1)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"EmptyKey", func() error {
			_, err := single.Claim(ctx, idem.ClaimRequest{Lease: time.Second, TTL: time.Second})
			return err
		}(), idem.ErrInvalidKey},
		{"LongKey", func() error {
			_, err := single.Claim(ctx, idem.ClaimRequest{Key: long, Lease: time.Second, TTL: time.Second})
			return err
		}(), idem.ErrInvalidKey},
		{"LongFingerprint", func() error {
			_, err := single.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), Fingerprint: make([]byte, idem.MaxFingerprintLen+1), Lease: time.Second, TTL: time.Second})
			return err
		}(), idem.ErrInvalidArgument},
		{"ZeroLease", func() error {
			_, err := single.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), TTL: time.Second})
			return err
		}(), idem.ErrInvalidArgument},
		{"KeyWithoutTime", func() error { _, err := timed.Claim(ctx, claimReq("not-a-uuid")); return err }(), idem.ErrInvalidKey},
		{"KeyWithoutTimeGet", func() error { _, err := timed.Get(ctx, []byte("not-a-uuid")); return err }(), idem.ErrInvalidKey},
		{"TokenZero", single.Complete(ctx, []byte("k"), 0, nil), idem.ErrInvalidArgument},
		{"HugeResult", single.Complete(ctx, []byte("k"), 1, make([]byte, idem.MaxResultLen+1)), idem.ErrInvalidArgument},
		{"LongCause", single.Fail(ctx, []byte("k"), 1, strings.Repeat("c", idem.MaxCauseLen+1)), idem.ErrInvalidArgument},
		{"HugeExtend", single.Extend(ctx, []byte("k"), 1, idem.MaxLease+1), idem.ErrInvalidArgument},
		{"DeleteEmpty", single.Delete(ctx, nil), idem.ErrInvalidKey},
		{"Unreachable", func() error { _, err := single.Get(ctx, []byte("k")); return err }(), idem.ErrUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) {
				t.Fatalf("err = %v, want %v", tc.err, tc.want)
			}
		})
	}
	res, err := timed.ClaimBatch(ctx, []idem.ClaimRequest{claimReq("nope")})
	if err != nil || !errors.Is(res[0].Err, idem.ErrInvalidKey) {
		t.Fatalf("batch with an untimed key: %v, %v", res, err)
	}
}

func TestConfigValidate(t *testing.T) {
	p, err := pgxpool.New(context.Background(), dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cases := []struct {
		name string
		cfg  pgstore.Config
		ok   bool
	}{
		{"Defaults", pgstore.Config{Pool: p}, true},
		{"NoPool", pgstore.Config{}, false},
		{"BadTable", pgstore.Config{Pool: p, Table: "a;drop"}, false},
		{"LongTable", pgstore.Config{Pool: p, Table: strings.Repeat("t", 41)}, false},
		{"BadSchema", pgstore.Config{Pool: p, Schema: "x y"}, false},
		{"BadNamespace", pgstore.Config{Pool: p, Namespace: "a b"}, false},
		{"Sharded", pgstore.Config{Pool: p, Layout: pgstore.LayoutSharded}, true},
		{"OneShard", pgstore.Config{Pool: p, Layout: pgstore.LayoutSharded, Shards: 1}, false},
		{"ShardsOnSingle", pgstore.Config{Pool: p, Shards: 4}, false},
		{"TimedWithoutKeyTime", pgstore.Config{Pool: p, Layout: pgstore.LayoutTimeOrdered}, false},
		{"PartitionedWeek", pgstore.Config{Pool: p, Layout: pgstore.LayoutTimePartitioned, KeyTime: pgstore.ULIDKeyTime, Period: 7 * 24 * time.Hour}, true},
		{"PartitionedHour", pgstore.Config{Pool: p, Layout: pgstore.LayoutTimePartitioned, KeyTime: pgstore.ULIDKeyTime, Period: time.Hour}, false},
		{"UnknownLayout", pgstore.Config{Pool: p, Layout: 9}, false},
		{"NegativePurgeBatch", pgstore.Config{Pool: p, PurgeBatch: -1}, false},
		{"CommitIdleTimeoutTiny", pgstore.Config{Pool: p, CommitIdleTimeout: time.Millisecond}, false},
		{"ResolveTimeoutBelowCommitIdle", pgstore.Config{Pool: p, CommitIdleTimeout: 5 * time.Second, ResolveTimeout: 3 * time.Second}, false},
		{"CommitTimeouts", pgstore.Config{Pool: p, CommitIdleTimeout: 100 * time.Millisecond, ResolveTimeout: time.Second}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("error %v does not match ErrInvalidArgument", err)
			}
		})
	}
}

func TestMigrate(t *testing.T) {
	p := sharedPool(t)
	schema := testSchema(t, p)
	cfg := pgstore.Config{Pool: p, Schema: schema, Table: "m", Layout: pgstore.LayoutSharded, Shards: 3}
	// Concurrent and repeated runs are harmless.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = pgstore.Migrate(ctxT(t), cfg) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := pgstore.Migrate(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := p.QueryRow(ctxT(t), "SELECT version FROM "+schema+".idem_schema_version WHERE tbl = 'm'").Scan(&v); err != nil || v != pgstore.SchemaVersion {
		t.Fatalf("version %d, %v", v, err)
	}
	// Another layout on the same table is refused.
	other := cfg
	other.Shards = 4
	if err := pgstore.Migrate(ctxT(t), other); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("migrate with other shard count: %v", err)
	}
	s, err := pgstore.New(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckSchema(ctxT(t)); err == nil {
		t.Fatal("CheckSchema accepted a table of another layout")
	}
	// A table never migrated is reported.
	none, _ := pgstore.New(pgstore.Config{Pool: p, Schema: schema, Table: "never"})
	if err := none.CheckSchema(ctxT(t)); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("CheckSchema on a missing table: %v", err)
	}
}

// uuid7 makes a UUIDv7 key for time tm.
func uuid7(tm time.Time, seq byte) []byte {
	var b [16]byte
	ms := tm.UnixMilli()
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70
	b[8] = 0x80
	b[15] = seq
	return b[:]
}

func TestPartitionRetention(t *testing.T) {
	p := sharedPool(t)
	cfg := pgstore.Config{Pool: p, Schema: testSchema(t, p), Table: "pt", Layout: pgstore.LayoutTimePartitioned,
		KeyTime: pgstore.UUIDv7KeyTime, Archive: true, Precreate: 1}
	s, _ := openStore(t, cfg)
	ctx := ctxT(t)
	old := time.Now().Add(-10 * 24 * time.Hour)
	older := time.Now().Add(-20 * 24 * time.Hour)
	short := idem.ClaimRequest{Key: uuid7(old, 1), Lease: 50 * time.Millisecond, TTL: 50 * time.Millisecond}
	long := idem.ClaimRequest{Key: uuid7(older, 1), Lease: time.Minute, TTL: time.Hour}
	c1, err := s.Claim(ctx, short) // partition created on demand
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, short.Key, c1.Record.Token, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, long); err != nil {
		t.Fatal(err)
	}
	parts, err := s.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 4 { // today, tomorrow, and the two old ones
		t.Fatalf("partitions %v, want 4", parts)
	}
	time.Sleep(100 * time.Millisecond)
	dropped, err := s.DropExpiredPartitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 || !strings.Contains(dropped[0], old.UTC().Format("20060102")) {
		t.Fatalf("dropped %v, want only the partition of %s (the other holds a live record)", dropped, old.Format("2006-01-02"))
	}
	if _, err := s.Get(ctx, long.Key); err != nil {
		t.Fatalf("live record lost: %v", err)
	}
	var archived int
	if err := p.QueryRow(ctx, "SELECT count(*) FROM "+cfg.Schema+".pt_history WHERE key = $1", short.Key).Scan(&archived); err != nil || archived != 1 {
		t.Fatalf("archived %d, %v", archived, err)
	}
	// A late duplicate of a key whose partition is gone recreates it, and
	// gets a larger token.
	c2, err := s.Claim(ctx, short)
	if err != nil || c2.Outcome != idem.OutcomeAcquired || c2.Record.Token <= c1.Record.Token {
		t.Fatalf("late claim: %+v, %v", c2, err)
	}
}

func TestPurgeArchive(t *testing.T) {
	for _, lc := range layouts {
		t.Run(lc.name, func(t *testing.T) {
			s, cfg := newStore(t, lc, "purge")
			ctx := ctxT(t)
			cfg.PurgeBatch = 7 // several small statements
			cfg.Archive = true
			s.Close()
			s, err := pgstore.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var reqs []idem.ClaimRequest
			for i := range 30 {
				reqs = append(reqs, idem.ClaimRequest{Key: []byte{'k', byte(i)}, Lease: 10 * time.Millisecond, TTL: 10 * time.Millisecond})
			}
			reqs = append(reqs, claimReq("keep"))
			if _, err := s.ClaimBatch(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			n, err := s.Purge(ctx, 0)
			if err != nil || n != 30 {
				t.Fatalf("purged %d, %v; want 30", n, err)
			}
			var archived int
			if err := cfg.Pool.QueryRow(ctx, "SELECT count(*) FROM "+cfg.Schema+".rec_history WHERE ns = 'purge'").Scan(&archived); err != nil || archived != 30 {
				t.Fatalf("archived %d, %v", archived, err)
			}
			if _, err := s.Get(ctx, []byte("keep")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCheckSchemaWarnsWithoutDurableCommits: with synchronous_commit off a
// crash can lose acknowledged claims; CheckSchema says so in the log, and
// stays quiet on the default.
func TestCheckSchemaWarnsWithoutDurableCommits(t *testing.T) {
	base := sharedPool(t)
	schema := testSchema(t, base)
	for _, tc := range []struct {
		setting string
		warn    bool
	}{{"on", false}, {"off", true}} {
		t.Run("synchronous_commit="+tc.setting, func(t *testing.T) {
			pc, err := pgxpool.ParseConfig(dsn())
			if err != nil {
				t.Fatal(err)
			}
			pc.ConnConfig.RuntimeParams["synchronous_commit"] = tc.setting
			pc.MaxConns = 2
			p, err := pgxpool.NewWithConfig(ctxT(t), pc)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var logs syncBuffer
			s, _ := openStore(t, pgstore.Config{Pool: p, Schema: schema, Table: "dur", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err := s.CheckSchema(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(logs.String(), "not durable"); got != tc.warn {
				t.Fatalf("warning logged: %v, want %v:\n%s", got, tc.warn, logs.String())
			}
		})
	}
}
