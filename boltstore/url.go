package boltstore

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storeurl"
)

// FromURL reads a Config from a bolt: URL, as the idem command's --store
// flag takes it:
//
//	bolt:///var/lib/app/idem.db    absolute path (empty host, like file:///)
//	bolt:idem.db, bolt:data/idem.db  path relative to the working directory
//
// with optional parameters namespace, fsync (group or always), max_batch,
// max_linger, sweep_interval, sweep_chunk, lock_timeout, skip_verify,
// mmap_size (bytes) and mode (octal file mode, e.g. 0640). bolt://idem.db is
// refused: "idem.db" would be the host, not the file. Percent-escapes in the
// path are decoded. Adjust the returned Config if needed, then call Open
// (which validates it).
func FromURL(rawURL string) (Config, error) {
	u, q, err := storeurl.Parse("boltstore", rawURL, "bolt")
	if err != nil {
		return Config{}, err
	}
	var c Config
	switch {
	case u.Opaque != "":
		// bolt:rel/path: url.Parse keeps the opaque part escaped.
		p, err := pathUnescape(u.Opaque)
		if err != nil {
			return Config{}, err
		}
		c.Path = filepath.FromSlash(p)
	case u.Host != "" && u.Host != "localhost":
		return Config{}, fmt.Errorf("%w: boltstore: bolt URL %q has host %q: use bolt:///absolute/path or bolt:relative/path", idem.ErrInvalidArgument, u.Redacted(), u.Host)
	case u.User != nil:
		return Config{}, fmt.Errorf("%w: boltstore: a bolt URL has no user", idem.ErrInvalidArgument)
	default:
		c.Path = filepath.FromSlash(u.Path)
	}
	if c.Path == "" || c.Path == "/" {
		return Config{}, fmt.Errorf("%w: boltstore: bolt URL %q names no file: use bolt:///absolute/path or bolt:relative/path", idem.ErrInvalidArgument, u.Redacted())
	}
	q.String("namespace", &c.Namespace)
	var fsync string
	q.Choice("fsync", &fsync, string(FsyncGroup), string(FsyncAlways))
	c.Fsync = FsyncPolicy(fsync)
	q.Int("max_batch", &c.MaxBatch, 1, 1<<16)
	q.Duration("max_linger", &c.MaxLinger)
	q.Duration("sweep_interval", &c.SweepInterval)
	q.Int("sweep_chunk", &c.SweepChunk, 1, 1<<16)
	q.Duration("lock_timeout", &c.LockTimeout)
	q.Bool("skip_verify", &c.SkipVerify)
	q.Int("mmap_size", &c.InitialMmapSize, 0, 1<<46)
	var mode string
	q.String("mode", &mode)
	if err := q.Done(); err != nil {
		return Config{}, err
	}
	if mode != "" {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m == 0 || m > 0o777 {
			return Config{}, fmt.Errorf("%w: boltstore: URL parameter mode=%q: want an octal file mode such as 0600", idem.ErrInvalidArgument, mode)
		}
		c.FileMode = os.FileMode(m)
	}
	return c, c.Validate()
}

func pathUnescape(s string) (string, error) {
	p, err := url.PathUnescape(s)
	if err != nil {
		return "", fmt.Errorf("%w: boltstore: bad path escape in %q", idem.ErrInvalidArgument, s)
	}
	return p, nil
}
