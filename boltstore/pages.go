package boltstore

import (
	"encoding/binary"
	"fmt"
	"os"
)

// bbolt's page layout (go.etcd.io/bbolt internal/common): a 16-byte header
// (id uint64, flags uint16, count uint16, overflow uint32), then count
// 16-byte elements. A branch element is pos, ksize (uint32) and the child's
// pgid (uint64); a leaf element is flags, pos, ksize, vsize (uint32). An
// element's key starts pos bytes after the element itself, a leaf's value
// right after its key. A leaf element flagged as a bucket holds a 16-byte
// bucket header (root pgid, sequence) and, for an inline bucket (root 0),
// the bucket's leaf page right after it. The freelist page lists pgids
// (uint64), its count in the first of them when the header's is 0xFFFF.
const (
	pageHeaderSize   = 16
	pageElementSize  = 16
	bucketHeaderSize = 16
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
	noFreelist       = ^uint64(0)
)

// checkPages walks the file's page tree from the meta page bbolt uses,
// reading the file itself (never bbolt's memory map), and refuses a file
// in which a page bbolt would reach lies past the high-water mark, or an
// element's key or value lies outside its page. Such damage makes bbolt
// read outside the file through its map: a SIGBUS or SIGSEGV, which the
// runtime turns into a panic only on goroutines that asked for it
// (debug.SetPanicOnFault), and bbolt's own consistency check (tx.Check)
// runs on a goroutine of its own: the fault there killed the process
// ("fatal error: fault", TestCorruptRandomBytes, 1 run in 100). What it
// lets through stays inside the file: bbolt's check and the record
// decoding find the rest. It checks bounds only, not order or reachability.
func checkPages(path string) (err error) {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	m, err := readMeta(f, st.Size())
	if err != nil {
		return err
	}
	w := &pageWalker{f: f, m: m, seen: map[uint64]bool{}}
	if m.freelist != noFreelist {
		if err := w.freelist(); err != nil {
			return err
		}
	}
	return w.page(m.root, "root bucket")
}

type pageWalker struct {
	f    *os.File
	m    fileMeta
	seen map[uint64]bool
}

var native = binary.NativeEndian

// read returns page id with its overflow pages.
func (w *pageWalker) read(id uint64, what string) ([]byte, error) {
	ps := uint64(w.m.pageSize)
	if id < 2 || id >= w.m.pgid {
		return nil, fmt.Errorf("%w: %s: page %d outside the file's pages [2, %d)", ErrCorrupt, what, id, w.m.pgid)
	}
	buf := make([]byte, ps)
	if _, err := w.f.ReadAt(buf, int64(id*ps)); err != nil {
		return nil, fmt.Errorf("%w: %s: page %d unreadable: %v", ErrCorrupt, what, id, err)
	}
	overflow := uint64(native.Uint32(buf[12:]))
	if overflow == 0 {
		return buf, nil
	}
	if id+overflow >= w.m.pgid {
		return nil, fmt.Errorf("%w: %s: page %d with %d overflow pages ends past the file's pages (%d)", ErrCorrupt, what, id, overflow, w.m.pgid)
	}
	buf = append(buf, make([]byte, overflow*ps)...)
	if _, err := w.f.ReadAt(buf[ps:], int64((id+1)*ps)); err != nil {
		return nil, fmt.Errorf("%w: %s: page %d unreadable: %v", ErrCorrupt, what, id, err)
	}
	return buf, nil
}

// freelist checks that the free pages listed are pages of the file.
func (w *pageWalker) freelist() error {
	buf, err := w.read(w.m.freelist, "freelist")
	if err != nil {
		return err
	}
	if native.Uint16(buf[8:])&freelistPageFlag == 0 {
		return fmt.Errorf("%w: freelist page %d has flags %#x", ErrCorrupt, w.m.freelist, native.Uint16(buf[8:]))
	}
	n, ids := uint64(native.Uint16(buf[10:])), buf[pageHeaderSize:]
	if n == 0xFFFF {
		if len(ids) < 8 {
			return fmt.Errorf("%w: freelist page %d truncated", ErrCorrupt, w.m.freelist)
		}
		n, ids = native.Uint64(ids), ids[8:]
	}
	if n > uint64(len(ids))/8 {
		return fmt.Errorf("%w: freelist page %d lists %d pages, room for %d", ErrCorrupt, w.m.freelist, n, len(ids)/8)
	}
	for i := range n {
		if id := native.Uint64(ids[i*8:]); id < 2 || id >= w.m.pgid {
			return fmt.Errorf("%w: freelist lists page %d, outside the file's pages [2, %d)", ErrCorrupt, id, w.m.pgid)
		}
	}
	return nil
}

// page checks page id and, through it, every page it leads to.
func (w *pageWalker) page(id uint64, what string) error {
	if w.seen[id] {
		return fmt.Errorf("%w: %s: page %d reached twice", ErrCorrupt, what, id)
	}
	w.seen[id] = true
	buf, err := w.read(id, what)
	if err != nil {
		return err
	}
	return w.elements(buf, fmt.Sprintf("page %d", id))
}

// elements checks the elements of the page in buf (a page read from the
// file, or an inline bucket's page inside its value), and follows them.
func (w *pageWalker) elements(buf []byte, where string) error {
	if len(buf) < pageHeaderSize {
		return fmt.Errorf("%w: %s: %d bytes, shorter than a page header", ErrCorrupt, where, len(buf))
	}
	flags, count := native.Uint16(buf[8:]), uint64(native.Uint16(buf[10:]))
	if flags != branchPageFlag && flags != leafPageFlag {
		return fmt.Errorf("%w: %s: flags %#x, want a branch or leaf page", ErrCorrupt, where, flags)
	}
	size := uint64(len(buf))
	if pageHeaderSize+count*pageElementSize > size {
		return fmt.Errorf("%w: %s: %d elements do not fit in %d bytes", ErrCorrupt, where, count, size)
	}
	for i := range count {
		at := pageHeaderSize + i*pageElementSize
		e := buf[at : at+pageElementSize]
		if flags == branchPageFlag {
			pos, ksize := uint64(native.Uint32(e[0:])), uint64(native.Uint32(e[4:]))
			if at+pos+ksize > size {
				return fmt.Errorf("%w: %s: branch element %d's key lies outside the page", ErrCorrupt, where, i)
			}
			if err := w.page(native.Uint64(e[8:]), fmt.Sprintf("%s element %d", where, i)); err != nil {
				return err
			}
			continue
		}
		eflags, pos, ksize, vsize := native.Uint32(e[0:]), uint64(native.Uint32(e[4:])), uint64(native.Uint32(e[8:])), uint64(native.Uint32(e[12:]))
		if at+pos+ksize+vsize > size {
			return fmt.Errorf("%w: %s: leaf element %d's key or value lies outside the page", ErrCorrupt, where, i)
		}
		if eflags&bucketLeafFlag == 0 {
			continue
		}
		v := buf[at+pos+ksize : at+pos+ksize+vsize]
		if len(v) < bucketHeaderSize {
			return fmt.Errorf("%w: %s: bucket element %d has a %d-byte value", ErrCorrupt, where, i, len(v))
		}
		if root := native.Uint64(v); root != 0 {
			if err := w.page(root, fmt.Sprintf("bucket at %s element %d", where, i)); err != nil {
				return err
			}
			continue
		}
		if err := w.elements(v[bucketHeaderSize:], fmt.Sprintf("inline bucket at %s element %d", where, i)); err != nil {
			return err
		}
	}
	return nil
}
