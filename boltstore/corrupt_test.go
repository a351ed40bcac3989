package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem"
)

const corruptRecords = 300

// goldenFile writes a store with corruptRecords completed records and returns
// its bytes and the size of the part bbolt uses (its high-water mark).
func goldenFile(t *testing.T) (data []byte, used int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "golden.db")
	s, err := Open(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var g errgroup
	for w := range 10 {
		g.Go(func() error {
			for i := w; i < corruptRecords; i += 10 {
				key := fmt.Sprintf("key-%04d", i)
				c, err := s.Claim(ctx, claimReq(key))
				if err != nil {
					return err
				}
				if err := s.Complete(ctx, []byte(key), c.Record.Token, []byte("result-"+key)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.b.bolt.View(func(tx *bbolt.Tx) error { used = int(tx.Size()); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err = os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data, used
}

func writeCase(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "case.db")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkRefused asserts that Open failed with ErrCorrupt and an error that
// names the file.
func checkRefused(t *testing.T, path string, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("Open accepted a damaged file")
	}
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open error does not wrap ErrCorrupt or name %s: %v", path, err)
	}
	t.Log(err)
}

func TestCorruptFileRefused(t *testing.T) {
	golden, used := goldenFile(t)
	page := os.Getpagesize()
	flip := func(offs ...int) []byte {
		d := bytes.Clone(golden)
		for _, o := range offs {
			d[o] ^= 0x5a
		}
		return d
	}
	// Every copy of a marker is damaged: freed pages may hold stale copies,
	// and damage there alone is harmless.
	flipAll := func(marker string, at int) []byte {
		d := bytes.Clone(golden)
		n := 0
		for i := 0; ; {
			j := bytes.Index(d[i:], []byte(marker))
			if j < 0 {
				break
			}
			d[i+j+at] ^= 0x5a
			i += j + len(marker)
			n++
		}
		if n == 0 {
			t.Fatalf("marker %q not in the golden file", marker)
		}
		return d
	}
	cases := []struct {
		name string
		data []byte
	}{
		{"Empty", nil},
		{"Truncated2Pages", golden[:2*page]},
		{"TruncatedBelowHighWater", golden[:used-page]},
		{"TruncatedMidPage", golden[:used-page/2-1]},
		{"BothMetaPages", flip(16+8, page+16+8)},
		{"Garbage", bytes.Repeat([]byte("not a database "), 1000)},
		{"RecordValue", flipAll("result-key-0150", 3)},
		{"LeafKey", flipAll("key-0151", 5)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeCase(t, tc.data)
			s, err := Open(Config{Path: path, LockTimeout: time.Second})
			if err == nil {
				s.Close()
			}
			checkRefused(t, path, err)
			// The file is left as it was: no silent reformat.
			if got, _ := os.ReadFile(path); !bytes.Equal(got, tc.data) {
				t.Fatal("Open modified the damaged file")
			}
		})
	}
}

// With SkipVerify a damaged record is found when it is read: that key fails
// with ErrCorrupt, the others are served.
func TestCorruptRecordSkipVerify(t *testing.T) {
	golden, _ := goldenFile(t)
	d := bytes.Clone(golden)
	for i := 0; ; {
		j := bytes.Index(d[i:], []byte("result-key-0150"))
		if j < 0 {
			break
		}
		d[i+j+3] ^= 1
		i += j + 1
	}
	s, err := Open(Config{Path: writeCase(t, d), SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Get(ctx, []byte("key-0150")); !errors.Is(err, ErrCorrupt) || !errors.Is(err, idem.ErrCorrupt) || errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("damaged record: %v", err)
	}
	if _, err := s.Claim(ctx, claimReq("key-0150")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("claim of damaged record: %v", err)
	}
	if r, err := s.Get(ctx, []byte("key-0149")); err != nil || string(r.Result) != "result-key-0149" {
		t.Fatalf("neighbour: %+v %v", r, err)
	}
	// In the commit loop: the damaged record's operation fails alone, the
	// operations sharing its transaction are re-applied and succeed.
	errs := make(chan error, 9)
	for i := range 9 {
		go func() {
			if i == 4 {
				errs <- s.Delete(ctx, []byte("key-0150"))
				return
			}
			_, err := s.Claim(ctx, claimReq(fmt.Sprint("new-", i)))
			errs <- err
		}()
	}
	failed := 0
	for range 9 {
		if err := <-errs; err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("unexpected error: %v", err)
			}
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d operations failed, want only the one on the damaged record", failed)
	}
	for i := range 9 {
		if _, err := s.Get(ctx, []byte(fmt.Sprint("new-", i))); (err == nil) != (i != 4) {
			t.Fatalf("new-%d: %v", i, err)
		}
	}
}

// One meta page damaged: bbolt falls back to the other, which describes the
// previous commit (what a torn meta write after a crash looks like). The file
// opens, passes the check and serves a consistent state.
func TestCorruptOneMetaFallsBack(t *testing.T) {
	golden, _ := goldenFile(t)
	for _, off := range []int{16 + 8, os.Getpagesize() + 16 + 8} {
		d := bytes.Clone(golden)
		d[off] ^= 0xff
		path := writeCase(t, d)
		s, err := Open(Config{Path: path})
		if err != nil {
			t.Fatalf("one meta page damaged at %d: %v", off, err)
		}
		n := 0
		for i := range corruptRecords {
			key := fmt.Sprintf("key-%04d", i)
			r, err := s.Get(context.Background(), []byte(key))
			if errors.Is(err, idem.ErrNotFound) {
				continue
			}
			if err != nil || (r.State == idem.StateCompleted && string(r.Result) != "result-"+key) {
				t.Fatalf("%s: %+v %v", key, r, err)
			}
			n++
		}
		if n < corruptRecords-1 {
			t.Fatalf("fallback to the previous commit lost %d records", corruptRecords-n)
		}
		s.Close()
	}
}

// A leaf element whose key offset points past the end of the file: bbolt
// would read it through its memory map, beyond the file (SIGBUS), and its
// consistency check runs on a goroutine of its own where such a fault is
// fatal ("fatal error: fault", not a panic Open could recover: seen in
// TestCorruptRandomBytes). Open refuses the file before bbolt reads it.
func TestCorruptPagePointerRefused(t *testing.T) {
	golden, _ := goldenFile(t)
	page := os.Getpagesize()
	d := bytes.Clone(golden)
	n := 0
	for off := 2 * page; off+page <= len(d); off += page {
		p := d[off : off+page]
		if binary.NativeEndian.Uint16(p[8:]) != leafPageFlag || !bytes.Contains(p, []byte("result-key-0150")) {
			continue
		}
		// Element 0's key, 16 bytes past its element at off+16, now starts
		// two pages past the end of the file (inside bbolt's map, which
		// reserves InitialMmapSize).
		binary.NativeEndian.PutUint32(p[16+4:], uint32(len(d)+2*page-(off+16)))
		n++
	}
	if n == 0 {
		t.Fatal("no leaf page holds result-key-0150")
	}
	path := writeCase(t, d)
	s, err := Open(Config{Path: path})
	if err == nil {
		s.Close()
	}
	checkRefused(t, path, err)
}

// Random single-byte damage anywhere in the used part of the file: Open
// refuses it (naming the file), or the damage was in a free page or in
// slack and every record reads back intact, or the one damaged record fails
// with ErrCorrupt. A wrong result is never served.
func TestCorruptRandomBytes(t *testing.T) {
	golden, used := goldenFile(t)
	rng := rand.New(rand.NewPCG(1, 2))
	iters := 40
	if testing.Short() {
		iters = 20
	}
	refused, harmless := 0, 0
	for i := range iters {
		d := bytes.Clone(golden)
		off := rng.IntN(used)
		d[off] ^= byte(1 + rng.IntN(255))
		path := writeCase(t, d)
		s, err := Open(Config{Path: path})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("iteration %d (offset %d): unexpected error: %v", i, off, err)
			}
			refused++
			continue
		}
		for j := range corruptRecords {
			key := fmt.Sprintf("key-%04d", j)
			r, err := s.Get(context.Background(), []byte(key))
			if err != nil {
				t.Fatalf("iteration %d (offset %d): %s: %v", i, off, key, err)
			}
			if string(r.Result) != "result-"+key {
				t.Fatalf("iteration %d (offset %d): %s served %q", i, off, key, r.Result)
			}
		}
		harmless++
		s.Close()
	}
	t.Logf("%d damaged files refused, %d damaged in unused bytes and served intact", refused, harmless)
}

// errgroup is a minimal stand-in for golang.org/x/sync/errgroup.
type errgroup struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func (g *errgroup) Go(fn func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := fn(); err != nil {
			g.mu.Lock()
			g.errs = append(g.errs, err)
			g.mu.Unlock()
		}
	}()
}

func (g *errgroup) Wait() error {
	g.wg.Wait()
	return errors.Join(g.errs...)
}

// What no checksum covers is checked at Open: a token counter below a stored
// token is refused (it would reissue tokens); wrong per-state counts (they
// only feed Stats) are rewritten.
func TestCorruptCountersAtOpen(t *testing.T) {
	golden, _ := goldenFile(t)
	tamper := func(t *testing.T, fn func(b *bbolt.Bucket) error) string {
		path := writeCase(t, golden)
		db, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bbolt.Tx) error { return fn(tx.Bucket([]byte(nsPrefix))) }); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	t.Run("TokenCounterLowered", func(t *testing.T) {
		path := tamper(t, func(b *bbolt.Bucket) error { return b.SetSequence(3) })
		s, err := Open(Config{Path: path})
		if err == nil {
			s.Close()
		}
		checkRefused(t, path, err)
	})
	t.Run("CountsWrong", func(t *testing.T) {
		path := tamper(t, func(b *bbolt.Bucket) error { return b.Put(countsKey, make([]byte, 32)) })
		s, err := Open(Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if st, err := s.Stats(context.Background()); err != nil || st.Completed != corruptRecords {
			t.Fatalf("stats after repair: %+v %v", st, err)
		}
	})
}

// TestPurgePassesDamagedRecords: maintenance leaves a record it cannot decode
// where it is (nothing proves it expired) and goes on with the others, even
// when damaged records fill whole purge chunks; Stats and ListInProgress
// serve the rest too.
func TestPurgePassesDamagedRecords(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	s := openTemp(t, func(c *Config) { c.Clock = clk; c.SweepInterval = -1; c.SweepChunk = 3 })
	ctx := context.Background()
	short := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Lease: time.Second, TTL: time.Second}
	}
	for i := range 20 {
		if _, err := s.Claim(ctx, short(fmt.Sprintf("k%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Claim(ctx, claimReq("held")); err != nil {
		t.Fatal(err)
	}
	// The first seven to expire (more than two chunks) are damaged.
	for i := range 7 {
		corruptRecord(t, s, []byte(fmt.Sprintf("k%02d", i)))
	}
	corruptRecord(t, s, []byte("k10"))
	clk.Add(2 * time.Second)
	n, err := s.Purge(ctx, 0)
	if err != nil || n != 12 {
		t.Fatalf("Purge = %d, %v; want the 12 undamaged expired records removed", n, err)
	}
	for i := range 20 {
		_, err := s.Get(ctx, []byte(fmt.Sprintf("k%02d", i)))
		if damaged := i < 7 || i == 10; damaged != errors.Is(err, idem.ErrCorrupt) || !damaged && !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("k%02d after purge: %v", i, err)
		}
	}
	if st, err := s.Stats(ctx); err != nil || st.InProgress < 1 {
		t.Fatalf("Stats next to damaged records: %+v %v", st, err)
	}
	recs, _, err := s.ListInProgress(ctx, "", 100)
	if err != nil || len(recs) != 1 || string(recs[0].Key) != "held" {
		t.Fatalf("ListInProgress next to damaged records: %+v %v", recs, err)
	}
}
