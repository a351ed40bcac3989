//go:build linux

package boltstore

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// faultFS is a FUSE loopback file system over a temporary directory whose
// fsyncs a test controls. bbolt offers no seam inside Commit (it writes the
// meta page and calls fdatasync on its own *os.File), so the seam is the
// file system: every fsync of a ".db" file calls the test's rule, which may
// block (to hold bbolt between its meta write and the fdatasync that makes
// it durable) or return an errno (which bbolt's fdatasync then returns, as a
// failing disk's would). Writes go through to the backing file at once (no
// FUSE writeback cache), so the rule can read the meta pages bbolt has
// written so far from there.
//
// Mounting needs root and /dev/fuse. Set BOLTSTORE_NO_FUSE=1 to skip these
// tests where that is not available; otherwise a failed mount fails the test.
type faultFS struct {
	mnt, back string
	mu        sync.Mutex
	rule      func(metaTxid uint64) syscall.Errno
}

func newFaultFS(t *testing.T) *faultFS {
	t.Helper()
	if os.Getenv("BOLTSTORE_NO_FUSE") != "" {
		t.Skip("BOLTSTORE_NO_FUSE is set: no FUSE file system to inject fsync faults")
	}
	f := &faultFS{mnt: t.TempDir(), back: t.TempDir()}
	var st syscall.Stat_t
	if err := syscall.Stat(f.back, &st); err != nil {
		t.Fatal(err)
	}
	root := &fs.LoopbackRoot{Path: f.back, Dev: uint64(st.Dev)}
	root.NewNode = func(rd *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &faultNode{LoopbackNode: fs.LoopbackNode{RootData: rd}, f: f}
	}
	root.RootNode = root.NewNode(root, nil, "", &st)
	srv, err := fs.Mount(f.mnt, root.RootNode, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMountStrict: true, FsName: "boltstore-faultfs", Name: "faultfs",
	}})
	if err != nil {
		t.Fatalf("mount a FUSE file system on %s (needs root and /dev/fuse; BOLTSTORE_NO_FUSE=1 skips): %v", f.mnt, err)
	}
	t.Cleanup(func() {
		f.onFsync(nil)
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount %s: %v", f.mnt, err)
		}
		srv.Wait()
	})
	return f
}

// path is name on the FUSE mount.
func (f *faultFS) path(name string) string { return filepath.Join(f.mnt, name) }

// onFsync sets the rule run on each fsync of a .db file (nil: pass every
// fsync through). The rule gets the highest transaction id among the meta
// pages written to the file so far.
func (f *faultFS) onFsync(rule func(metaTxid uint64) syscall.Errno) {
	f.mu.Lock()
	f.rule = rule
	f.mu.Unlock()
}

// metaTxid reads the transaction ids of bbolt's two meta pages (page header
// 16 bytes, then magic, version, pageSize, flags, root, freelist, pgid, txid
// at offset 48) from the backing file and returns the higher.
func (f *faultFS) metaTxid(name string) uint64 {
	b, err := os.ReadFile(filepath.Join(f.back, name))
	ps := os.Getpagesize()
	if err != nil || len(b) < 2*ps {
		return 0
	}
	return max(binary.NativeEndian.Uint64(b[16+48:]), binary.NativeEndian.Uint64(b[ps+16+48:]))
}

type faultNode struct {
	fs.LoopbackNode
	f *faultFS
}

var _ = (fs.NodeFsyncer)((*faultNode)(nil))

func (n *faultNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if name := n.Path(nil); strings.HasSuffix(name, ".db") {
		n.f.mu.Lock()
		rule := n.f.rule
		n.f.mu.Unlock()
		if rule != nil {
			if e := rule(n.f.metaTxid(name)); e != 0 {
				return e
			}
		}
	}
	if s, ok := fh.(fs.FileFsyncer); ok {
		return s.Fsync(ctx, flags)
	}
	return 0
}
