package boltstore_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
)

func TestFromURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want boltstore.Config
		err  string // "" for success
	}{
		{url: "bolt:///var/lib/idem.db", want: boltstore.Config{Path: "/var/lib/idem.db"}},
		{url: "bolt://localhost/var/lib/idem.db", want: boltstore.Config{Path: "/var/lib/idem.db"}},
		{url: "bolt:idem.db", want: boltstore.Config{Path: "idem.db"}},
		{url: "BOLT:data/my%20file.db", want: boltstore.Config{Path: filepath.FromSlash("data/my file.db")}},
		{url: "bolt:///x.db?namespace=orders&fsync=always&max_batch=64&max_linger=1ms&sweep_interval=-1s&sweep_chunk=9&lock_timeout=3s&skip_verify&mmap_size=1048576&mode=0640",
			want: boltstore.Config{Path: "/x.db", Namespace: "orders", Fsync: boltstore.FsyncAlways, MaxBatch: 64, MaxLinger: time.Millisecond,
				SweepInterval: 0, SweepChunk: 9, LockTimeout: 3 * time.Second, SkipVerify: true, InitialMmapSize: 1 << 20, FileMode: 0o640},
			err: "negative"},
		{url: "bolt:///x.db?namespace=orders&fsync=always&max_batch=64&max_linger=1ms&sweep_chunk=9&lock_timeout=3s&skip_verify&mmap_size=1048576&mode=0640",
			want: boltstore.Config{Path: "/x.db", Namespace: "orders", Fsync: boltstore.FsyncAlways, MaxBatch: 64, MaxLinger: time.Millisecond,
				SweepChunk: 9, LockTimeout: 3 * time.Second, SkipVerify: true, InitialMmapSize: 1 << 20, FileMode: 0o640}},
		{url: "bolt://idem.db", err: `has host "idem.db"`},
		{url: "bolt://", err: "names no file"},
		{url: "bolt:///", err: "names no file"},
		{url: "bolt://u:secret@/x.db", err: "no user"},
		{url: "redis://x", err: `scheme "redis"`},
		{url: "bolt:///x.db?fsync=sometimes", err: "fsync"},
		{url: "bolt:///x.db?max_batch=0", err: "max_batch"},
		{url: "bolt:///x.db?max_batch=x", err: "not an integer"},
		{url: "bolt:///x.db?lock_timeout=3", err: "not a duration"},
		{url: "bolt:///x.db?skip_verify=maybe", err: "true or false"},
		{url: "bolt:///x.db?mode=999", err: "octal"},
		{url: "bolt:///x.db?namespace=a&namespace=b", err: "given 2 times"},
		{url: "bolt:///x.db?namespace=no%20spaces", err: "namespace"},
		{url: "bolt:///x.db?nope=1&also=2", err: "unknown URL parameter(s) also, nope"},
		{url: "bolt:///x.db?%zz", err: "bad URL query"},
		{url: "bolt:%zz", err: "bad path escape"},
		{url: ":", err: "bad URL"},
	} {
		got, err := boltstore.FromURL(tc.url)
		if tc.err != "" {
			if err == nil || !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("FromURL(%q) = %v; want ErrInvalidArgument containing %q", tc.url, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("FromURL(%q) = %+v, %v; want %+v", tc.url, got, err, tc.want)
		}
	}
}

func TestFromURLOpens(t *testing.T) {
	dir := t.TempDir()
	cfg, err := boltstore.FromURL("bolt://" + filepath.ToSlash(filepath.Join(dir, "u.db")) + "?namespace=n1&fsync=always")
	if err != nil {
		t.Fatal(err)
	}
	cfg.SweepInterval = -1 // adjusted after parsing
	s, err := boltstore.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(filepath.Join(dir, "u.db")); err != nil {
		t.Fatal(err)
	}
}
