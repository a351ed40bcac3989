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
// together with idem.ErrUnavailable, by operations that meet a record whose
// checksum fails.
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
	const magic, version = 0xED0CDAED, 2
	type meta struct {
		pageSize     uint32
		pgid, txid   uint64
		valid        bool
		invalidCause string
	}
	read := func(off int64) meta {
		buf := make([]byte, 16+64)
		if _, err := f.ReadAt(buf, off); err != nil {
			return meta{invalidCause: fmt.Sprintf("meta page at offset %d unreadable: %v", off, err)}
		}
		m := buf[16:]
		le := binary.NativeEndian
		if le.Uint32(m[0:]) != magic {
			return meta{invalidCause: fmt.Sprintf("meta page at offset %d: bad magic (not a bbolt file?)", off)}
		}
		if le.Uint32(m[4:]) != version {
			return meta{invalidCause: fmt.Sprintf("meta page at offset %d: bbolt version %d", off, le.Uint32(m[4:]))}
		}
		h := fnv.New64a()
		h.Write(m[:56])
		if h.Sum64() != le.Uint64(m[56:]) {
			return meta{invalidCause: fmt.Sprintf("meta page at offset %d: checksum mismatch", off)}
		}
		return meta{pageSize: le.Uint32(m[8:]), pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:]), valid: true}
	}
	m0 := read(0)
	var m1 meta
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
		return fmt.Errorf("%w: both meta pages are invalid (%s; %s)", ErrCorrupt, m0.invalidCause, m1.invalidCause)
	}
	if need := int64(best.pgid) * int64(best.pageSize); size < need {
		return fmt.Errorf("%w: file is %d bytes but its metadata (txid %d) needs %d: truncated", ErrCorrupt, size, best.txid, need)
	}
	return nil
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
		err = verify(db)
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

// verify runs bbolt's consistency check (every page reachable or free, keys
// ordered) and decodes every record.
func verify(db *bbolt.DB) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: reading it failed: %v", ErrCorrupt, r)
		}
	}()
	return db.View(func(tx *bbolt.Tx) error {
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
			r := b.Bucket(recordsBucket)
			if r == nil || b.Bucket(expiryBucket) == nil || b.Bucket(progressIndex) == nil {
				return fmt.Errorf("%w: namespace bucket %q lacks a sub-bucket", ErrCorrupt, name)
			}
			return r.ForEach(func(k, v []byte) error {
				if _, err := decode(k, v); err != nil {
					return fmt.Errorf("%w: namespace %q key %q: %w", ErrCorrupt, name[len(nsPrefix):], k, err)
				}
				return nil
			})
		})
	})
}
