package pgstore_test

import (
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
func TestConformance(t *testing.T) {
	for _, lc := range layouts {
		t.Run(lc.name, func(t *testing.T) {
			var mu sync.Mutex
			cfgs := map[testing.TB]pgstore.Config{}
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
				t.Cleanup(func() { s.Close() })
				return s
			}, storetest.Features{Batch: true, CompleteBatch: true, Purge: true, List: true, Stats: true, LeaseUnit: 250 * time.Millisecond})
		})
	}
}
