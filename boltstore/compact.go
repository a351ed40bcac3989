package boltstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/idem-dev/idem"
)

// Compact copies the store at src into a new, tightly packed file at dst
// (which must not exist) and checks the copy. bbolt reuses the pages that
// deletes and purges free, so a file stops growing once its retention window
// is full, but it never shrinks; Compact gives the space back after a spike.
// The store must be closed: src is opened read-only, and a process holding
// it makes Compact fail with ErrInUse. Swap the files with a rename once it
// returns nil.
func Compact(src, dst string, lockTimeout time.Duration) error {
	if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: boltstore: compact: %s exists", idem.ErrInvalidArgument, dst)
	}
	cfg := Config{Path: src, LockTimeout: lockTimeout}
	cfg.setDefaults()
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("boltstore: compact %s: %w", src, err)
	}
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("boltstore: compact %s: %w", src, err)
	}
	err = checkMeta(f, st.Size())
	f.Close()
	if err != nil {
		return fmt.Errorf("boltstore: compact %s: %w", src, err)
	}
	in, err := openBolt(src, 0, &bbolt.Options{ReadOnly: true, Timeout: cfg.LockTimeout})
	if errors.Is(err, bberrors.ErrTimeout) {
		return fmt.Errorf("boltstore: compact %s: %w: %w: close the store first", src, idem.ErrUnavailable, ErrInUse)
	}
	if err != nil {
		return fmt.Errorf("boltstore: compact %s: %w", src, err)
	}
	defer in.Close()
	if _, err := verify(in); err != nil {
		return fmt.Errorf("boltstore: compact %s: %w", src, err)
	}
	out, err := openBolt(dst, cfg.FileMode, &bbolt.Options{Timeout: cfg.LockTimeout, FreelistType: bbolt.FreelistMapType})
	if err != nil {
		return fmt.Errorf("boltstore: compact into %s: %w", dst, err)
	}
	err = bbolt.Compact(out, in, 64<<20)
	if err == nil {
		_, err = verify(out)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(filepath.Dir(dst))
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("boltstore: compact %s into %s: %w", src, dst, err)
	}
	return nil
}
