package mysqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

func TestConfigValidate(t *testing.T) {
	db := &sql.DB{} // never used: Validate does no I/O
	kt := mysqlstore.UUIDv7KeyTime
	for _, tc := range []struct {
		name string
		cfg  mysqlstore.Config
		ok   bool
	}{
		{"defaults", mysqlstore.Config{DB: db}, true},
		{"no db", mysqlstore.Config{}, false},
		{"bad table", mysqlstore.Config{DB: db, Table: "idem; DROP"}, false},
		{"long table", mysqlstore.Config{DB: db, Table: strings.Repeat("t", 49)}, false},
		{"bad namespace", mysqlstore.Config{DB: db, Namespace: "a b"}, false},
		{"sharded default", mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutSharded}, true},
		{"one shard", mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutSharded, Shards: 1}, false},
		{"shards on single", mysqlstore.Config{DB: db, Shards: 4}, false},
		{"timed without KeyTime", mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutTimeOrdered}, false},
		{"timed", mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutTimeOrdered, KeyTime: kt}, true},
		{"partitioned weekly", mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutTimePartitioned, KeyTime: kt, Period: 7 * 24 * time.Hour}, true},
		{"partitioned hourly", mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutTimePartitioned, KeyTime: kt, Period: time.Hour}, false},
		{"short retention", mysqlstore.Config{DB: db, Layout: mysqlstore.LayoutTimePartitioned, KeyTime: kt, Retention: time.Second}, false},
		{"unknown layout", mysqlstore.Config{DB: db, Layout: 9}, false},
		{"purge batch", mysqlstore.Config{DB: db, PurgeBatch: -1}, false},
		{"max batch", mysqlstore.Config{DB: db, MaxBatch: 20000}, false},
		{"lock wait", mysqlstore.Config{DB: db, LockWait: -time.Second}, false},
	} {
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
	for _, s := range []string{"single", "sharded", "time_ordered", "time_partitioned"} {
		l, err := mysqlstore.ParseLayout(s)
		if err != nil || l.String() != s {
			t.Fatalf("ParseLayout(%q) = %v, %v", s, l, err)
		}
	}
	if _, err := mysqlstore.ParseLayout("nope"); err == nil {
		t.Fatal("ParseLayout accepted nope")
	}
}

func TestMigrateIdempotentAndChecked(t *testing.T) {
	_, db := newDB(t)
	ctx := testCtx(t)
	cfg := mysqlstore.Config{DB: db, Table: "m", Archive: true}
	if _, err := mysqlstore.Open(ctx, cfg); !errors.Is(err, mysqlstore.ErrSchema) {
		t.Fatalf("Open before Migrate: %v, want ErrSchema", err)
	}
	for i := 0; i < 2; i++ {
		if err := mysqlstore.Migrate(ctx, cfg); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	var ver int
	if err := db.QueryRowContext(ctx, "SELECT version FROM idem_schema_versions WHERE table_name = 'm'").Scan(&ver); err != nil || ver != mysqlstore.SchemaVersion {
		t.Fatalf("version row: %d, %v", ver, err)
	}
	other := cfg
	other.Layout, other.Shards = mysqlstore.LayoutSharded, 4
	if err := mysqlstore.Migrate(ctx, other); !errors.Is(err, mysqlstore.ErrSchema) {
		t.Fatalf("Migrate with another layout: %v, want ErrSchema", err)
	}
	if _, err := mysqlstore.Open(ctx, other); !errors.Is(err, mysqlstore.ErrSchema) {
		t.Fatalf("Open with another layout: %v, want ErrSchema", err)
	}
	s, err := mysqlstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// The unique index is on a binary hash: keys differing only in case,
// trailing spaces, NUL or invalid UTF-8 are distinct records (a utf8mb4
// VARCHAR key under the default collation would merge several of them).
func TestKeysAreBytes(t *testing.T) {
	s, _ := newStore(t, mysqlstore.Config{})
	ctx := testCtx(t)
	keys := [][]byte{[]byte("Key"), []byte("key"), []byte("key "), []byte("key  "), []byte("key\x00"), {0xff, 0xfe}, []byte("ké"), []byte("ke\u0301"), bytes.Repeat([]byte{'x'}, idem.MaxKeyLen)}
	res, err := s.ClaimBatch(ctx, func() []idem.ClaimRequest {
		var r []idem.ClaimRequest
		for _, k := range keys {
			r = append(r, idem.ClaimRequest{Key: k, Lease: time.Minute, TTL: time.Hour})
		}
		return r
	}())
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
			t.Fatalf("key %q: %+v", keys[i], r)
		}
		if err := s.Complete(ctx, keys[i], r.Claim.Record.Token, keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		rec, err := s.Get(ctx, k)
		if err != nil || !bytes.Equal(rec.Key, k) || !bytes.Equal(rec.Result, k) {
			t.Fatalf("Get(%q) = %+v, %v", k, rec, err)
		}
	}
}

// Entries for the same key in one batch behave as if claimed one after the
// other, including a fingerprint mismatch followed by a matching entry that
// takes over a released key.
func TestBatchDuplicatesInOrder(t *testing.T) {
	s, _ := newStore(t, mysqlstore.Config{})
	ctx := testCtx(t)
	fp := func(k, f string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Fingerprint: []byte(f), Lease: time.Minute, TTL: time.Hour}
	}
	c, err := s.Claim(ctx, fp("rel", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, []byte("rel"), c.Record.Token, "retry"); err != nil {
		t.Fatal(err)
	}
	res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{
		fp("new", "X"), fp("new", "X"), fp("new", "Y"), fp("new", ""),
		fp("rel", "B"), fp("rel", "A"), fp("rel", "A"),
		{Key: nil, Lease: time.Minute, TTL: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		out idem.Outcome
		err error
	}{
		{idem.OutcomeAcquired, nil}, {idem.OutcomeInProgress, nil}, {0, idem.ErrFingerprintMismatch}, {idem.OutcomeInProgress, nil},
		{0, idem.ErrFingerprintMismatch}, {idem.OutcomeAcquired, nil}, {idem.OutcomeInProgress, nil},
		{0, idem.ErrInvalidKey},
	}
	for i, w := range want {
		r := res[i]
		if w.err != nil {
			if !errors.Is(r.Err, w.err) {
				t.Fatalf("entry %d: %+v, want %v", i, r, w.err)
			}
			continue
		}
		if r.Err != nil || r.Claim.Outcome != w.out {
			t.Fatalf("entry %d: %+v, want %s", i, r, w.out)
		}
	}
	if res[5].Claim.Record.Token <= c.Record.Token || res[5].Claim.Record.Attempts != 2 || res[5].Claim.Record.LastError != "retry" {
		t.Fatalf("takeover record %+v (first token %d)", res[5].Claim.Record, c.Record.Token)
	}
}

// The record a claim returns for a new key is the stored one, field for
// field, whatever the statement's form: a VALUES list (small batches) or a
// derived table (16+ rows), on an untimed and a timed layout, with and
// without a fingerprint, with nonces above 2^63 among them.
func TestClaimRecordMatchesStored(t *testing.T) {
	for _, cfg := range []mysqlstore.Config{
		{Layout: mysqlstore.LayoutSingle},
		{Layout: mysqlstore.LayoutTimePartitioned, KeyTime: anyKeyTime},
	} {
		t.Run(cfg.Layout.String(), func(t *testing.T) {
			s, _ := newStore(t, cfg)
			ctx := testCtx(t)
			for _, n := range []int{1, 3, 40} {
				reqs := make([]idem.ClaimRequest, n)
				for i := range reqs {
					reqs[i] = idem.ClaimRequest{Key: fmt.Appendf(nil, "rec-%d-%d", n, i), Lease: time.Duration(1+i) * time.Second, TTL: time.Hour}
					if i%2 == 0 {
						reqs[i].Fingerprint = fmt.Appendf(nil, "fp-%d", i)
					}
				}
				res, err := s.ClaimBatch(ctx, reqs)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range res {
					if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
						t.Fatalf("batch %d entry %d: %+v", n, i, r)
					}
					got, err := s.Get(ctx, reqs[i].Key)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(r.Claim.Record, got) {
						t.Fatalf("batch %d entry %d: claim returned %+v, stored %+v", n, i, r.Claim.Record, got)
					}
				}
			}
		})
	}
}

func TestTimedLayoutsRejectKeysWithoutTime(t *testing.T) {
	for _, l := range []mysqlstore.Layout{mysqlstore.LayoutTimeOrdered, mysqlstore.LayoutTimePartitioned} {
		t.Run(l.String(), func(t *testing.T) {
			s, _ := newStore(t, mysqlstore.Config{Layout: l, KeyTime: mysqlstore.UUIDv7KeyTime})
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // proves the error comes before any I/O
			if _, err := s.Claim(ctx, claimReq("not-a-uuid")); !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("Claim: %v", err)
			}
			res, err := s.ClaimBatch(context.Background(), []idem.ClaimRequest{claimReq("not-a-uuid"), claimReq("0192e4a0-7d6e-7cc1-8a2b-9c3d4e5f6a7b")})
			if err != nil || !errors.Is(res[0].Err, idem.ErrInvalidKey) || res[1].Claim.Outcome != idem.OutcomeAcquired {
				t.Fatalf("batch: %+v, %v", res, err)
			}
		})
	}
}

func TestPurgeArchive(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{Archive: true, PurgeBatch: 3})
	ctx := testCtx(t)
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte(k), Lease: time.Millisecond, TTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, []byte(k), c.Record.Token, []byte("r-"+k)); err != nil && !errors.Is(err, idem.ErrNotFound) {
			t.Fatal(err)
		}
	}
	if _, err := s.Claim(ctx, claimReq("live")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	n, err := s.Purge(ctx, 5)
	if err != nil || n != 5 {
		t.Fatalf("Purge(5) = %d, %v", n, err)
	}
	n, err = s.Purge(ctx, 0)
	if err != nil || n != 2 {
		t.Fatalf("Purge(0) = %d, %v", n, err)
	}
	var hist, live int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_records_history").Scan(&hist); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_records").Scan(&live); err != nil {
		t.Fatal(err)
	}
	if hist != 7 || live != 1 {
		t.Fatalf("history %d rows, table %d rows; want 7 and 1", hist, live)
	}
}

func TestPartitions(t *testing.T) {
	s, db := newStore(t, mysqlstore.Config{Layout: mysqlstore.LayoutTimePartitioned, KeyTime: mysqlstore.UUIDv7KeyTime, Precreate: 3, Retention: time.Minute, Archive: true})
	ctx := testCtx(t)
	// The first partition ends at today's midnight (UTC); it may be dropped
	// a Retention later. Right after midnight, wait that minute out.
	if wait := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(time.Minute + time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	parts := func() []string {
		rows, err := db.QueryContext(ctx, "SELECT PARTITION_NAME FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idem_records' ORDER BY PARTITION_ORDINAL_POSITION")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			rows.Scan(&n)
			out = append(out, n)
		}
		return out
	}
	before := parts()
	// first partition (everything older than today), today, 3 ahead, pmax
	if len(before) != 6 || before[len(before)-1] != "pmax" {
		t.Fatalf("partitions %v", before)
	}
	if n, err := s.EnsurePartitions(ctx); err != nil || n != 0 {
		t.Fatalf("EnsurePartitions on a fresh table = %d, %v", n, err)
	}
	// Keys 3 days old land in the first partition; one stays live, so
	// nothing may be dropped yet.
	old := uuidv7(time.Now().Add(-72*time.Hour), 1)
	old2 := uuidv7(time.Now().Add(-72*time.Hour), 2)
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: old, Lease: time.Millisecond, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: old2, Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if d, err := s.DropExpiredPartitions(ctx); err != nil || len(d) != 0 {
		t.Fatalf("dropped %v, %v with a live record", d, err)
	}
	if _, err := s.Get(ctx, old2); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, old2); err != nil {
		t.Fatal(err)
	}
	d, err := s.DropExpiredPartitions(ctx)
	if err != nil || len(d) != 1 || d[0] != before[0] {
		t.Fatalf("DropExpiredPartitions = %v, %v; want [%s]", d, err, before[0])
	}
	// Both rows reach the history: the expired one and the deleted one
	// (Delete expires a record in place; it leaves with its partition).
	var hist int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_records_history").Scan(&hist); err != nil || hist != 2 {
		t.Fatalf("archived %d, %v", hist, err)
	}
	// An old key now lands in the next partition; claims still work.
	if c, err := s.Claim(ctx, claimReq(string(old))); err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("claim of an old key after drop: %+v %v", c, err)
	}
	// Future keys beyond the precreated partitions go to pmax.
	if _, err := s.Claim(ctx, claimReq(string(uuidv7(time.Now().Add(30*24*time.Hour), 3)))); err != nil {
		t.Fatal(err)
	}
	notPart, _ := newStore(t, mysqlstore.Config{})
	if _, err := notPart.EnsurePartitions(ctx); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("EnsurePartitions on a single table: %v", err)
	}
}

// uuidv7 makes a canonical-text UUIDv7 for time t with a fixed tail.
func uuidv7(t time.Time, n byte) []byte {
	ms := t.UnixMilli()
	var b [16]byte
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70
	b[8] = 0x80
	b[15] = n
	const hx = "0123456789abcdef"
	var out []byte
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hx[c>>4], hx[c&15])
	}
	return out
}

// A token operation whose UPDATE finds nothing to change, and whose record
// changes before the read that explains why, so that the UPDATE would now
// apply: here a Release with the token a concurrent claim is issuing runs
// its UPDATE before the claim's row exists and its read after. On
// 364ee14 it answered ErrFenced, which no order of the two calls explains
// (before the claim: ErrNotFound; after it: released), and storetest's
// porcupine check failed now and then on a loaded machine. The answer must
// be one of those two, and the record must agree with it.
func TestFinishRacesClaimBetweenUpdateAndRead(t *testing.T) {
	name, _ := newDB(t)
	isRead := func(b []byte) bool { return b[0] == 0x03 && bytes.HasPrefix(b[1:], []byte("SELECT state, token FROM")) }
	proxy := newCutProxyAt(t, serverAddr(), isRead)
	viaProxy := storeAt(t, proxy.ln.Addr().String(), name, nil)
	other := storeAt(t, serverAddr(), name, nil)
	ctx := testCtx(t)
	for _, op := range []string{"release", "complete", "fail", "extend"} {
		t.Run(op, func(t *testing.T) {
			key := []byte("race-" + op)
			probe, err := other.Claim(ctx, claimReq("probe-"+op))
			if err != nil {
				t.Fatal(err)
			}
			next := probe.Record.Token + 1 // the table's sequence is ours alone
			var claimed idem.Claim
			var once sync.Once
			hold := func(body []byte) {
				if isRead(body) {
					once.Do(func() { claimed, err = other.Claim(ctx, claimReq(string(key))) })
				}
			}
			proxy.hold.Store(&hold)
			var opErr error
			switch op {
			case "release":
				opErr = viaProxy.Release(ctx, key, next, "")
			case "complete":
				opErr = viaProxy.Complete(ctx, key, next, []byte("r"))
			case "fail":
				opErr = viaProxy.Fail(ctx, key, next, "x")
			case "extend":
				opErr = viaProxy.Extend(ctx, key, next, 2*time.Minute)
			}
			proxy.hold.Store(nil)
			if err != nil || claimed.Outcome != idem.OutcomeAcquired || claimed.Record.Token != next {
				t.Fatalf("the claim between the statements: %+v, %v (wanted token %d)", claimed, err, next)
			}
			r, err := other.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case errors.Is(opErr, idem.ErrNotFound): // ordered before the claim
				if r.State != idem.StateInProgress || r.LeaseUntil.After(claimed.Record.LeaseUntil) {
					t.Fatalf("%s answered ErrNotFound but the record is %+v", op, r)
				}
			case opErr == nil: // ordered after the claim: applied
				want := map[string]idem.State{"release": idem.StateReleased, "complete": idem.StateCompleted, "fail": idem.StateFailed, "extend": idem.StateInProgress}[op]
				if r.State != want || (op == "extend" && !r.LeaseUntil.After(claimed.Record.LeaseUntil)) {
					t.Fatalf("%s answered nil but the record is %+v", op, r)
				}
			default:
				t.Fatalf("%s with the token being issued concurrently = %v; want nil (after the claim) or ErrNotFound (before it)", op, opErr)
			}
		})
	}
}
