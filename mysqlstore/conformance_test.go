package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
	"github.com/idem-dev/idem/storetest"
)

// layoutConfigs are the layouts the conformance suite runs on. The timed
// layouts get keys without a time from the suite, so they use a KeyTime
// that maps any key to a fixed-width time derived from its bytes.
func layoutConfigs() map[string]mysqlstore.Config {
	return map[string]mysqlstore.Config{
		"single":           {Layout: mysqlstore.LayoutSingle},
		"single_statement": {Layout: mysqlstore.LayoutSingle, SingleStatement: true},
		"sharded":          {Layout: mysqlstore.LayoutSharded, Shards: 4},
		"time_ordered":     {Layout: mysqlstore.LayoutTimeOrdered, KeyTime: anyKeyTime},
		// Retention of a minute: the maintenance case drops the old
		// partitions its short records leave (see maintKeys).
		"time_partitioned": {Layout: mysqlstore.LayoutTimePartitioned, KeyTime: anyKeyTime, Retention: time.Minute},
	}
}

// derivedConfigs run the suite again with every claim statement taking its
// rows from a derived table (the form large batches use), on both claim
// paths and a timed layout.
var derivedConfigs = map[string]bool{"single": true, "single_statement": true, "time_partitioned": true}

// anyKeyTime gives every key a time (a pure function of the key) so the
// suite's arbitrary keys work on the timed layouts: "@<unix seconds>-..."
// carries its own (see maintKeys); any other key is spread over the ten
// days before today by a hash of its bytes.
func anyKeyTime(key []byte) (time.Time, error) {
	if len(key) > 2 && key[0] == '@' {
		if end := strings.IndexByte(string(key), '-'); end > 1 {
			if sec, err := strconv.ParseInt(string(key[1:end]), 10, 64); err == nil {
				return time.Unix(sec, 0).UTC(), nil
			}
		}
	}
	var h uint64
	for _, c := range key {
		h = h*31 + uint64(c)
	}
	base := time.Now().UTC().Truncate(24 * time.Hour).Add(-10 * 24 * time.Hour)
	return base.Add(time.Duration(h%(10*24*3600)) * time.Second), nil
}

// oldDay is the start of the day n days before today (UTC).
func oldDay(n int) time.Time {
	return time.Now().UTC().Truncate(24 * time.Hour).Add(-time.Duration(n) * 24 * time.Hour)
}

// splitOldPartitions splits the partition that holds everything before
// today into daily partitions for the days from..1 before today (from the
// oldest), so that maintenance has old partitions to drop.
func splitOldPartitions(t testing.TB, db *sql.DB, table string, from int) {
	t.Helper()
	var defs []string
	for d := from; d >= 0; d-- {
		b := oldDay(d)
		defs = append(defs, fmt.Sprintf("PARTITION p_lt_%s VALUES LESS THAN (%d)", b.Format("20060102"), b.UnixMicro()))
	}
	if _, err := db.ExecContext(testCtx(t), "ALTER TABLE "+table+" REORGANIZE PARTITION p_lt_"+oldDay(0).Format("20060102")+" INTO ("+strings.Join(defs, ", ")+")"); err != nil {
		t.Fatal(err)
	}
}

// maintKeys places storetest's maintenance keys in partitions older than
// any other key of the suite (anyKeyTime spreads those over the last ten
// days): short-lived records alone in the days 14, 13 and 12 before today,
// so their partitions become droppable while the suite claims them again;
// the long-lived and extended ones on day 11.
func maintKeys(i int) []byte {
	day := 11
	if i%3 == 1 { // storetest's short-TTL kind
		day = 12 + (i/3)%3
	}
	return fmt.Appendf(nil, "@%d-maint-%d", oldDay(day).Add(time.Hour).Unix(), i)
}

// maintain is one maintenance round: Purge, and for the partitioned layout
// partition upkeep and drops.
func maintain(ctx context.Context, st idem.Store) error {
	s := st.(*mysqlstore.Store)
	if _, err := s.Purge(ctx, 0); err != nil {
		return err
	}
	if _, err := s.EnsurePartitions(ctx); err != nil {
		return err
	}
	_, err := s.DropExpiredPartitions(ctx)
	return err
}

func TestConformance(t *testing.T) {
	type run struct {
		cfg     mysqlstore.Config
		derived bool
	}
	runs := map[string]run{}
	for name, cfg := range layoutConfigs() {
		runs[name] = run{cfg: cfg}
		if derivedConfigs[name] {
			runs[name+"_derived"] = run{cfg: cfg, derived: true}
		}
	}
	for name, r := range runs {
		cfg := r.cfg
		t.Run(name, func(t *testing.T) {
			// Side by side: each run has a database of its own.
			t.Parallel()
			_, db := newDB(t)
			cfg.DB = db
			cfg.Table = "idem_conf"
			if err := mysqlstore.Migrate(testCtx(t), cfg); err != nil {
				t.Fatal(err)
			}
			partitioned := cfg.Layout == mysqlstore.LayoutTimePartitioned
			if partitioned {
				splitOldPartitions(t, db, cfg.Table, 14)
			}
			var mu sync.Mutex
			nsOf := map[idem.Store]string{}
			feat := storetest.Features{Batch: true, CompleteBatch: true, ExtendBatch: true, Purge: true, List: true, Stats: true, ForceRelease: true, LeaseUnit: 100 * time.Millisecond,
				CorruptRecord: func(t testing.TB, st idem.Store, key []byte) {
					mu.Lock()
					ns := nsOf[st]
					mu.Unlock()
					corruptRecord(t, db, cfg, ns, key)
				},
				Maintain: func(ctx context.Context, st idem.Store) error {
					if !partitioned {
						_, err := st.(*mysqlstore.Store).Purge(ctx, 0)
						return err
					}
					return maintain(ctx, st)
				},
			}
			if partitioned {
				feat.Keys = maintKeys
			}
			storetest.Run(t, func(t testing.TB, ns string) idem.Store {
				c := cfg
				c.Namespace = ns
				s, err := mysqlstore.Open(testCtx(t), c)
				if err != nil {
					t.Fatal(err)
				}
				if r.derived {
					mysqlstore.SetDerivedMin(s, 1)
				}
				mu.Lock()
				nsOf[s] = ns
				mu.Unlock()
				t.Cleanup(func() { s.Close() })
				return s
			}, feat)
		})
	}
}

// corruptRecord gives key's row in namespace ns a state no operation
// writes, behind the store's back.
func corruptRecord(t testing.TB, db *sql.DB, cfg mysqlstore.Config, ns string, key []byte) {
	t.Helper()
	tables := []string{cfg.Table}
	if cfg.Layout == mysqlstore.LayoutSharded {
		tables = nil
		for i := 0; i < cfg.Shards; i++ {
			tables = append(tables, fmt.Sprintf("%s_%02d", cfg.Table, i))
		}
	}
	n := int64(0)
	for _, tb := range tables {
		res, err := db.ExecContext(testCtx(t), "UPDATE "+tb+" SET state = 9 WHERE ns = ? AND k = ?", []byte(ns), key)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := res.RowsAffected()
		n += m
	}
	if n != 1 {
		t.Fatalf("corrupting %q changed %d rows", key, n)
	}
}
