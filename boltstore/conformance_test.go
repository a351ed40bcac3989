package boltstore

import (
	"bytes"
	"context"
	"fmt"
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
	}, storetest.Features{
		Batch: true, CompleteBatch: true, ExtendBatch: true, Purge: true, List: true, Stats: true, ForceRelease: true, LeaseUnit: 200 * time.Millisecond,
		CorruptRecord: corruptRecord,
		// Maintenance is Purge (the default) racing the background sweeper,
		// which runs every 50ms here. Compact needs the store closed.
	})
}

// corruptRecord flips one byte of key's stored record behind the store's
// back (but through its commit loop, which publishes what readers may see),
// as bit rot after Open's check would: the record's CRC then fails.
func corruptRecord(t testing.TB, st idem.Store, key []byte) {
	t.Helper()
	s := st.(*Store)
	err := s.b.do(context.Background(), func(w *wtx, _ int64) (error, error) {
		r := w.tx.Bucket(s.name).Bucket(recordsBucket)
		v := bytes.Clone(r.Get(key))
		if v == nil {
			return nil, fmt.Errorf("no record for %q", key)
		}
		v[len(v)/2] ^= 0x20
		return nil, r.Put(key, v)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The two suites run side by side (each has a file of its own), after the
// sequential tests: one mostly waits for fsync.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance(t, FsyncGroup)
}

func TestConformanceFsyncAlways(t *testing.T) {
	t.Parallel()
	conformance(t, FsyncAlways)
}
