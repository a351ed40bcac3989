package mysqlstore_test

import (
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
		"time_partitioned": {Layout: mysqlstore.LayoutTimePartitioned, KeyTime: anyKeyTime},
	}
}

// derivedConfigs run the suite again with every claim statement taking its
// rows from a derived table (the form large batches use), on both claim
// paths and a timed layout.
var derivedConfigs = map[string]bool{"single": true, "single_statement": true, "time_partitioned": true}

// anyKeyTime gives every key a time (a pure function of the key, spread
// over the last ten days) so the suite's arbitrary keys work on the timed
// layouts.
func anyKeyTime(key []byte) (time.Time, error) {
	var h uint64
	for _, c := range key {
		h = h*31 + uint64(c)
	}
	base := time.Now().UTC().Truncate(24 * time.Hour).Add(-10 * 24 * time.Hour)
	return base.Add(time.Duration(h%(10*24*3600)) * time.Second), nil
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
			_, db := newDB(t)
			cfg.DB = db
			cfg.Table = "idem_conf"
			if err := mysqlstore.Migrate(testCtx(t), cfg); err != nil {
				t.Fatal(err)
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
				t.Cleanup(func() { s.Close() })
				return s
			}, storetest.Features{Batch: true, CompleteBatch: true, Purge: true, List: true, Stats: true, LeaseUnit: 100 * time.Millisecond})
		})
	}
}
