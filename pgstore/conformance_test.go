package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
	"github.com/idem-dev/idem/storetest"
)

// TestConformance runs the shared store suite against every layout. Both
// stores a test asks for share one schema and table (different namespaces).
// LeaseUnit is 250ms: every write is a durable commit, and on this shared
// machine an fsync stall of 100ms+ between a claim and its completion would
// expire a 100ms record (seen in practice).
//
// Maintenance is Purge plus, for the time-partitioned layout,
// DropExpiredPartitions; the maintenance case's keys land in periods of
// their own, long over (testKeyTime), so partitions holding live and
// expired records are dropped, or kept, and recreated while it runs.
// A damaged record is a state out of range written with SQL: every column
// has a SQL type, so nothing else can be undecodable short of a broken
// disk page, which PostgreSQL reports as an error of the statement.
//
// The layouts run side by side: each has schemas of its own (one per
// case), and they share only the test binary's pool (24 connections).
func TestConformance(t *testing.T) {
	for _, lc := range layouts {
		t.Run(lc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			cfgs := map[testing.TB]pgstore.Config{}
			nss := map[idem.Store]string{}
			feat := storetest.Features{Batch: true, CompleteBatch: true, ExtendBatch: true, Purge: true, List: true, Stats: true, ForceRelease: true, LeaseUnit: 250 * time.Millisecond}
			feat.CorruptRecord = func(t testing.TB, st idem.Store, key []byte) {
				mu.Lock()
				cfg, ns := cfgs[t], nss[st]
				mu.Unlock()
				corruptRecord(t, cfg, ns, key)
			}
			feat.Maintain = func(ctx context.Context, st idem.Store) error {
				s := st.(*pgstore.Store)
				if _, err := s.Purge(ctx, 0); err != nil {
					return err
				}
				if lc.partitioned() {
					_, err := s.DropExpiredPartitions(ctx)
					return err
				}
				return nil
			}
			if lc.timed() {
				feat.Keys = func(i int) []byte { return fmt.Appendf(nil, "old-%d-maint-%d", 10+i, i) }
			}
			storetest.Run(t, func(t testing.TB, ns string) idem.Store {
				mu.Lock()
				cfg, ok := cfgs[t]
				mu.Unlock()
				if !ok {
					_, cfg = newStore(t, lc, ns)
					mu.Lock()
					cfgs[t] = cfg
					mu.Unlock()
					t.Cleanup(func() { mu.Lock(); delete(cfgs, t); mu.Unlock() })
				}
				cfg.Namespace = ns
				s, err := pgstore.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				nss[s] = ns
				mu.Unlock()
				t.Cleanup(func() { s.Close() })
				return s
			}, feat)
		})
	}
}

// corruptRecord gives key's record in namespace ns a state no version of
// pgstore writes.
func corruptRecord(t testing.TB, cfg pgstore.Config, ns string, key []byte) {
	t.Helper()
	tables := []string{cfg.Table}
	if cfg.Layout == pgstore.LayoutSharded {
		tables = tables[:0]
		for i := range cfg.Shards {
			tables = append(tables, fmt.Sprintf("%s_s%03d", cfg.Table, i))
		}
	}
	n := int64(0)
	for _, tb := range tables {
		tag, err := cfg.Pool.Exec(context.Background(), "UPDATE "+cfg.Schema+"."+tb+" SET state = 99 WHERE ns = $1 AND key = $2", ns, key)
		if err != nil {
			t.Fatal(err)
		}
		n += tag.RowsAffected()
	}
	if n != 1 {
		t.Fatalf("damaged %d records of %q, want 1", n, key)
	}
}
