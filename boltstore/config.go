package boltstore

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/idem-dev/idem"
)

// FsyncPolicy says how commits reach the disk. Under both policies an
// operation returns success only after the commit holding it has been
// written and fsynced (fdatasync on Linux), so it survives kill -9 and power
// loss; they differ in how many operations share one commit.
type FsyncPolicy string

const (
	// FsyncGroup (the default): operations that arrive while a commit is in
	// flight are applied together in the next transaction and share its
	// fsync. Risk: a failed commit fails every operation in it (each caller
	// gets the error; none is reported done), and one operation may wait for
	// the commit ahead of it before its own (at most about two commits).
	FsyncGroup FsyncPolicy = "group"
	// FsyncAlways: one transaction and one fsync per operation. Same
	// durability as FsyncGroup; throughput is bounded by the disk's fsync
	// rate (a few thousand per second on an SSD). Use it only to isolate
	// operations from each other's failures or to measure.
	FsyncAlways FsyncPolicy = "always"
)

// Config configures Open. Only Path is required.
type Config struct {
	// Path of the database file; it is created (mode FileMode) if missing.
	// An existing file that is empty, truncated, corrupt or not a boltstore
	// file makes Open fail: the store never silently starts empty.
	Path string
	// FileMode for a new file (default 0600).
	FileMode os.FileMode
	// Namespace served by the handle Open returns ("" is the default
	// namespace). Store.Namespace gives handles on others in the same file.
	Namespace string
	// Fsync policy (default FsyncGroup).
	Fsync FsyncPolicy
	// MaxBatch bounds the operations in one group commit (default 1024).
	MaxBatch int
	// MaxLinger caps how long the commit loop waits for stragglers when a
	// batch is smaller than recent ones (default 500µs; negative: never
	// wait). The wait is at most a quarter of the previous commit, so it
	// trades a little latency for fuller commits under concurrency only.
	MaxLinger time.Duration
	// SweepInterval is how often the background sweeper purges expired
	// records of every namespace in the file (default 1m; negative
	// disables it, leaving Purge to the caller).
	SweepInterval time.Duration
	// SweepChunk is how many records one purge transaction removes at most
	// (default 512), so a sweep never holds the writer for long.
	SweepChunk int
	// LockTimeout is how long Open waits for the file lock held by another
	// process before it fails with an "in use" error (default 1s).
	LockTimeout time.Duration
	// SkipVerify skips the full check Open runs on an existing file (every
	// page reachable or free, every record's checksum, token counter and
	// index sizes). The check reads the whole file once (measured: 2.3 s
	// for 1M records, 290 MB); skipping it means corruption is found when
	// the damaged record is read, and a page damaged so that bbolt would
	// read past the end of the file crashes the process when an operation
	// reaches it (a memory fault), where the check refuses the file.
	SkipVerify bool
	// InitialMmapSize reserves address space up front (default 256 MiB) so
	// that read transactions rarely wait for a remap as the file grows.
	InitialMmapSize int
	// Clock defaults to the system clock. Leases and retention are measured
	// on it; one process owns the file, so one clock serves all workers.
	Clock idem.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.FileMode == 0 {
		c.FileMode = 0o600
	}
	if c.Fsync == "" {
		c.Fsync = FsyncGroup
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 1024
	}
	if c.MaxLinger == 0 {
		c.MaxLinger = 500 * time.Microsecond
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	if c.SweepChunk == 0 {
		c.SweepChunk = 512
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = time.Second
	}
	if c.InitialMmapSize == 0 {
		c.InitialMmapSize = 256 << 20
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports a configuration error (wrapping idem.ErrInvalidArgument).
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: boltstore: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
	}
	if c.Path == "" {
		return bad("Path is required")
	}
	if err := idem.ValidateNamespace(c.Namespace); err != nil {
		return err
	}
	switch c.Fsync {
	case "", FsyncGroup, FsyncAlways:
	default:
		return bad("Fsync %q: want %q or %q", c.Fsync, FsyncGroup, FsyncAlways)
	}
	if c.MaxBatch < 0 || c.MaxBatch > 1<<16 {
		return bad("MaxBatch %d outside [1, 65536]", c.MaxBatch)
	}
	if c.SweepChunk < 0 || c.SweepChunk > 1<<16 {
		return bad("SweepChunk %d outside [1, 65536]", c.SweepChunk)
	}
	if c.LockTimeout < 0 {
		return bad("LockTimeout %s < 0", c.LockTimeout)
	}
	if c.InitialMmapSize < 0 {
		return bad("InitialMmapSize %d < 0", c.InitialMmapSize)
	}
	return nil
}
