package storetest_test

import (
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The suite runs itself against the reference store. Its maintenance is
// Purge (the suite's default) racing the background sweeper, made frequent
// here. CorruptRecord stays nil: the memory store holds decoded values, so
// no record of it can fail to decode.
func TestMemstoreConformance(t *testing.T) {
	root, err := memstore.New(memstore.Config{SweepInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	storetest.Run(t, func(t testing.TB, ns string) idem.Store {
		s, err := root.Namespace(ns)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, storetest.Features{Batch: true, CompleteBatch: true, ExtendBatch: true, Purge: true, List: true, Stats: true, ForceRelease: true, LeaseUnit: 20 * time.Millisecond})
}
