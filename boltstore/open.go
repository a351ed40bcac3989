package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/idem-dev/idem"
)

// ErrCorrupt is wrapped by the error Open returns for a file it refuses to
// serve: truncated, damaged, or not a boltstore file. It is also wrapped,
// together with idem.ErrCorrupt, by the operations on a key whose record
// fails its checksum (an error of that key alone: nothing is written, the
// other keys are served, in a batch it is that entry's error).
var ErrCorrupt = errors.New("boltstore: corrupt file")

// ErrInUse is wrapped (together with idem.ErrUnavailable) by the error Open
// returns when another process holds the file.
var ErrInUse = errors.New("boltstore: file in use")

// Top-level layout of the file (see docs/boltstore.md):
//
//	"idem"     meta bucket: "format" -> formatTag
//	"ns/<ns>"  one bucket per namespace; its bucket sequence is the token
//	           counter, and it holds:
//	  "r"      records: key -> encoded rec
//	  "x"      expiry index: expiresAt (8 bytes BE) | key -> nil
//	  "p"      in-progress index: token (8 bytes BE) | key -> nil
//	  "counts" per-state record counts (4 x uint64 BE)
var (
	metaBucket    = []byte("idem")
	formatKey     = []byte("format")
	formatTag     = []byte("idem-boltstore/1")
	nsPrefix      = "ns/"
	recordsBucket = []byte("r")
	expiryBucket  = []byte("x")
	progressIndex = []byte("p")
	countsKey     = []byte("counts")
)

// checkMeta reads bbolt's two meta pages itself, before bbolt maps the file,
// so that a truncated file is refused with a clear message instead of a
// fault on a page past the end. Layout (go.etcd.io/bbolt internal/common):
// a 16-byte page header, then magic, version, pageSize, flags (uint32),
// root bucket (2 x uint64), freelist, pgid, txid, checksum (uint64), the
// checksum being FNV-64a of the 56 bytes before it.
func checkMeta(f *os.File, size int64) error {
	_, err := readMeta(f, size)
	return err
}

// fileMeta is the meta page bbolt uses: the valid one with the higher txid.
type fileMeta struct {
	pageSize     uint32
	root         uint64 // the root bucket's page
	freelist     uint64 // the freelist's page (noFreelist: none)
	pgid, txid   uint64 // pgid: the high-water mark, in pages
	valid        bool
	invalidCause string
}

// readMeta is checkMeta returning the meta page bbolt will use.
func readMeta(f *os.File, size int64) (fileMeta, error) {
	const magic, version = 0xED0CDAED, 2
	read := func(off int64) fileMeta {
		buf := make([]byte, 16+64)
		if _, err := f.ReadAt(buf, off); err != nil {
			return fileMeta{invalidCause: fmt.Sprintf("meta page at offset %d unreadable: %v", off, err)}
		}
		m := buf[16:]
		le := binary.NativeEndian
		if le.Uint32(m[0:]) != magic {
			return fileMeta{invalidCause: fmt.Sprintf("meta page at offset %d: bad magic (not a bbolt file?)", off)}
		}
		if le.Uint32(m[4:]) != version {
			return fileMeta{invalidCause: fmt.Sprintf("meta page at offset %d: bbolt version %d", off, le.Uint32(m[4:]))}
		}
		h := fnv.New64a()
		h.Write(m[:56])
		if h.Sum64() != le.Uint64(m[56:]) {
			return fileMeta{invalidCause: fmt.Sprintf("meta page at offset %d: checksum mismatch", off)}
		}
		return fileMeta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]),
			pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:]), valid: true}
	}
	m0 := read(0)
	var m1 fileMeta
	if m0.valid {
		m1 = read(int64(m0.pageSize))
	} else {
		// Meta 0 holds the page size; without it, try the usual ones.
		m1 = read(int64(os.Getpagesize()))
		for _, ps := range []int64{4096, 8192, 16384, 65536} {
			if m1.valid {
				break
			}
			if m := read(ps); m.valid {
				m1 = m
			}
		}
	}
	best := m0
	if !m0.valid || (m1.valid && m1.txid > m0.txid) {
		best = m1
	}
	if !best.valid {
		return best, fmt.Errorf("%w: both meta pages are invalid (%s; %s)", ErrCorrupt, m0.invalidCause, m1.invalidCause)
	}
	if need := int64(best.pgid) * int64(best.pageSize); size < need {
		return best, fmt.Errorf("%w: file is %d bytes but its metadata (txid %d) needs %d: truncated", ErrCorrupt, size, best.txid, need)
	}
	return best, nil
}

// openBolt opens the file with bbolt, turning a memory fault on a damaged
// page into an error instead of a crash.
func openBolt(path string, mode os.FileMode, opts *bbolt.Options) (db *bbolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: bbolt failed reading it: %v", ErrCorrupt, r)
		}
	}()
	return bbolt.Open(path, mode, opts)
}

// openFile opens or creates the bbolt file and checks it (see Config.Path).
func openFile(cfg *Config) (*bbolt.DB, error) {
	path := cfg.Path
	fail := func(err error) error { return fmt.Errorf("boltstore: open %s: %w", path, err) }
	st, err := os.Stat(path)
	existed := err == nil
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fail(fmt.Errorf("%w: %w", idem.ErrUnavailable, err))
	case existed && !st.Mode().IsRegular():
		return nil, fail(fmt.Errorf("%w: not a regular file", ErrCorrupt))
	case existed && st.Size() == 0:
		// bbolt would format an empty file as a new database. An empty
		// file here is a truncated store (or a crash while creating one):
		// refuse rather than start empty; delete it to start afresh.
		return nil, fail(fmt.Errorf("%w: file is empty (truncated?); refusing to start an empty store over it (remove the file to create a new one)", ErrCorrupt))
	case existed:
		f, err := os.Open(path)
		if err != nil {
			return nil, fail(fmt.Errorf("%w: %w", idem.ErrUnavailable, err))
		}
		err = checkMeta(f, st.Size())
		f.Close()
		if err != nil {
			return nil, fail(err)
		}
	}
	opts := &bbolt.Options{
		Timeout:         cfg.LockTimeout,
		FreelistType:    bbolt.FreelistMapType,
		InitialMmapSize: cfg.InitialMmapSize,
	}
	db, err := openBolt(path, cfg.FileMode, opts)
	switch {
	case errors.Is(err, bberrors.ErrTimeout):
		return nil, fail(fmt.Errorf("%w: %w: another process holds its lock (waited %s)", idem.ErrUnavailable, ErrInUse, cfg.LockTimeout))
	case errors.Is(err, bberrors.ErrInvalid), errors.Is(err, bberrors.ErrChecksum), errors.Is(err, bberrors.ErrVersionMismatch):
		return nil, fail(fmt.Errorf("%w: %w", ErrCorrupt, err))
	case err != nil && errors.Is(err, ErrCorrupt):
		return nil, fail(err)
	case err != nil:
		return nil, fail(fmt.Errorf("%w: %w", idem.ErrUnavailable, err))
	}
	if !existed {
		// Make the new file's directory entry durable too.
		if err := syncDir(filepath.Dir(path)); err != nil {
			db.Close()
			return nil, fail(fmt.Errorf("%w: fsync directory: %w", idem.ErrUnavailable, err))
		}
	}
	// Check before the first write: nothing is written over a damaged file.
	fresh, err := checkFormat(db)
	if err == nil && existed && !cfg.SkipVerify {
		var fix map[string][4]int64
		if fix, err = verify(db); err == nil && len(fix) > 0 {
			cfg.Logger.Warn("boltstore: per-state counts did not match the records; rewritten", "path", path, "namespaces", len(fix))
			err = fixCounts(db, fix)
		}
	}
	if err == nil && fresh {
		err = stampFormat(db)
	}
	if err != nil {
		db.Close()
		return nil, fail(err)
	}
	return db, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// checkFormat reports whether the file still needs its format stamp, and
// refuses a bbolt file that has buckets but no stamp (someone else's) or a
// stamp of another format. It only reads.
func checkFormat(db *bbolt.DB) (fresh bool, err error) {
	err = db.View(func(tx *bbolt.Tx) error {
		if m := tx.Bucket(metaBucket); m != nil {
			if got := m.Get(formatKey); string(got) != string(formatTag) {
				return fmt.Errorf("%w: format %q, this build reads %q", ErrCorrupt, got, formatTag)
			}
			return nil
		}
		var other []byte
		_ = tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
			other = clone(name)
			return io.EOF
		})
		if other != nil {
			return fmt.Errorf("%w: a bbolt file with bucket %q but no boltstore format stamp: not a boltstore file", ErrCorrupt, other)
		}
		fresh = true
		return nil
	})
	return fresh, err
}

func stampFormat(db *bbolt.DB) error {
	return db.Update(func(tx *bbolt.Tx) error {
		m, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		return m.Put(formatKey, formatTag)
	})
}

// verify checks that every page bbolt would reach lies inside the file
// (checkPages), then runs bbolt's consistency check (every page reachable
// or free, keys ordered), decodes every record and checks each namespace
// (verifySpace). It returns the per-state counts of the namespaces whose
// stored counts are off: they only feed Stats, so Open rewrites them
// rather than refuse.
func verify(db *bbolt.DB) (fix map[string][4]int64, err error) {
	if err := checkPages(db.Path()); err != nil {
		return nil, err
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: reading it failed: %v", ErrCorrupt, r)
		}
	}()
	err = db.View(func(tx *bbolt.Tx) error {
		var errs []error
		for e := range tx.Check() {
			if len(errs) < 5 {
				errs = append(errs, e)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w: consistency check: %w", ErrCorrupt, errors.Join(errs...))
		}
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			if string(name) == string(metaBucket) {
				return nil
			}
			if len(name) < len(nsPrefix) || string(name[:len(nsPrefix)]) != nsPrefix {
				return fmt.Errorf("%w: unknown bucket %q", ErrCorrupt, name)
			}
			sp := space{ns: b, r: b.Bucket(recordsBucket), x: b.Bucket(expiryBucket), p: b.Bucket(progressIndex)}
			if sp.r == nil || sp.x == nil || sp.p == nil {
				return fmt.Errorf("%w: namespace bucket %q lacks a sub-bucket", ErrCorrupt, name)
			}
			counts, err := verifySpace(name[len(nsPrefix):], sp)
			if err == nil && counts != sp.counts() {
				if fix == nil {
					fix = map[string][4]int64{}
				}
				fix[string(name)] = counts
			}
			return err
		})
	})
	return fix, err
}

// fixCounts rewrites the stored counts verify found wrong.
func fixCounts(db *bbolt.DB, fix map[string][4]int64) error {
	return db.Update(func(tx *bbolt.Tx) error {
		for name, c := range fix {
			b := tx.Bucket([]byte(name))
			if b == nil {
				continue
			}
			v := make([]byte, 32)
			for i := range c {
				binary.BigEndian.PutUint64(v[8*i:], uint64(c[i]))
			}
			if err := b.Put(countsKey, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// verifySpace decodes every record of a namespace and checks what no
// checksum covers: the token counter is at least every stored token (a
// lower one would reissue tokens), the counts match the records, and each
// index has one entry per record it indexes.
func verifySpace(ns []byte, sp space) ([4]int64, error) {
	var (
		counts   [4]int64
		maxToken uint64
	)
	err := sp.r.ForEach(func(k, v []byte) error {
		r, err := decode(k, v)
		if err != nil {
			return fmt.Errorf("%w: namespace %q key %q: %w", ErrCorrupt, ns, k, err)
		}
		counts[r.state-idem.StateInProgress]++
		maxToken = max(maxToken, r.token)
		return nil
	})
	if err != nil {
		return counts, err
	}
	if seq := sp.ns.Sequence(); seq < maxToken {
		return counts, fmt.Errorf("%w: namespace %q: token counter %d is below a stored token %d", ErrCorrupt, ns, seq, maxToken)
	}
	nx, np := 0, 0
	_ = sp.x.ForEach(func(_, _ []byte) error { nx++; return nil })
	_ = sp.p.ForEach(func(_, _ []byte) error { np++; return nil })
	if total := counts[0] + counts[1] + counts[2] + counts[3]; int64(nx) != total || int64(np) != counts[0] {
		return counts, fmt.Errorf("%w: namespace %q: %d records (%d in progress) but %d expiry and %d in-progress index entries", ErrCorrupt, ns, total, counts[0], nx, np)
	}
	return counts, nil
}
