package boltstore

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storetest"
)

// conformance runs the shared suite; every namespace it asks for lives in
// one file, so isolation between namespaces is really tested. LeaseUnit is
// generous because a commit waits for fsync, which takes tens of
// milliseconds on a disk shared with busy neighbours.
func conformance(t *testing.T, fsync FsyncPolicy) {
	root, err := Open(Config{Path: filepath.Join(t.TempDir(), "idem.db"), Fsync: fsync, SweepInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	storetest.Run(t, func(t testing.TB, ns string) idem.Store {
		s, err := root.Namespace(ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, storetest.Features{Batch: true, CompleteBatch: true, Purge: true, List: true, Stats: true, LeaseUnit: 200 * time.Millisecond})
}

func TestConformance(t *testing.T) { conformance(t, FsyncGroup) }

func TestConformanceFsyncAlways(t *testing.T) { conformance(t, FsyncAlways) }
