package snowflake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/idem-dev/idem"
)

// Errors of a Generator.
var (
	// ErrClockBackwards: the clock went back further than
	// Config.MaxBackwards, or did not come back within it. No id is made
	// until the clock passes the last millisecond used.
	ErrClockBackwards = errors.New("snowflake: clock moved backwards")
	// ErrExhausted: the layout's time bits are used up (past Layout.End).
	ErrExhausted = errors.New("snowflake: layout time range exhausted")
	// ErrNoWorker: every worker id of the layout is leased by a live
	// generator.
	ErrNoWorker = errors.New("snowflake: no free worker id")
)

var errLapsed = errors.New("snowflake: worker lease not renewed in time")

// ClockBackwardsError says how far the clock went back. It matches
// ErrClockBackwards.
type ClockBackwardsError struct {
	Back, Max time.Duration
}

func (e *ClockBackwardsError) Error() string {
	return fmt.Sprintf("snowflake: clock moved backwards by %s (more than the %s waited out); no id until it passes the last one used", e.Back, e.Max)
}

// Is reports a match with ErrClockBackwards.
func (e *ClockBackwardsError) Is(target error) bool { return target == ErrClockBackwards }

// Defaults of a Config.
const (
	DefaultMaxBackwards   = 100 * time.Millisecond
	DefaultLease          = 30 * time.Second
	DefaultLeaseRetention = 7 * 24 * time.Hour
	DefaultLeaseName      = "default"
)

// Hooks observe a Generator. Nil fields are skipped. They may run with the
// generator's lock held: they must be fast and must not call the
// Generator.
type Hooks struct {
	// OnClockBackwards: Next saw the clock behind the last millisecond
	// used by back; waited says whether it waited (within MaxBackwards) or
	// refused.
	OnClockBackwards func(back time.Duration, waited bool)
	// OnLeaseLost: the worker lease is gone (taken over, deleted, or not
	// renewed before it ran out); Next fails until a renewal succeeds, or
	// for good when permanent is true.
	OnLeaseLost func(worker int64, permanent bool, err error)
}

// Config configures a Generator. The zero value makes worker 0 of the
// default layout: fine for one process, wrong for two. Set Store (or a
// Worker unique among live generators) for more.
type Config struct {
	// Layout of the ids (zero: DefaultLayout).
	Layout Layout
	// Worker is the worker id when Store is nil. The caller keeps it
	// unique among live generators of the same id space.
	Worker int64
	// Store, when set, leases a free worker id from it (one claim per
	// worker id, kept alive by a heartbeat): generators on one Store never
	// share a worker id while their leases live, whether the Store is
	// Redis, SQL or the embedded file. Worker is then ignored.
	Store idem.Store
	// LeaseName separates id spaces sharing a Store (default "default");
	// [A-Za-z0-9._-], at most 64 bytes.
	LeaseName string
	// Lease is the worker lease (default 30s): a generator that crashed
	// frees its worker id after it; one that cannot renew stops making ids
	// before it ends.
	Lease time.Duration
	// Heartbeat is the renewal interval (default Lease/3, at most Lease/2).
	Heartbeat time.Duration
	// LeaseRetention is how long a released worker record (holding the
	// last millisecond used, so the next holder starts after it) is kept
	// (default 7 days).
	LeaseRetention time.Duration
	// MaxBackwards is the largest step back of the clock that Next waits
	// out (default 100ms); a larger one gets ErrClockBackwards. Negative:
	// refuse every step back.
	MaxBackwards time.Duration
	// Clock defaults to the system clock. Tests inject one.
	Clock idem.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	Hooks  Hooks

	// manualBeat (tests only, export_test.go): no heartbeat goroutine;
	// the test renews the lease when it chooses, so with a manual Clock a
	// lease lapses only when the test moves time past it.
	manualBeat bool
}

func (c Config) withDefaults() Config {
	c.Layout = c.Layout.withDefaults()
	if c.LeaseName == "" {
		c.LeaseName = DefaultLeaseName
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.Lease / 3
	}
	if c.LeaseRetention == 0 {
		c.LeaseRetention = DefaultLeaseRetention
	}
	if c.MaxBackwards == 0 {
		c.MaxBackwards = DefaultMaxBackwards
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks the configuration after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := c.Layout.Validate(); err != nil {
		return err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: snowflake: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
	}
	if c.Store == nil && (c.Worker < 0 || c.Worker > c.Layout.MaxWorker()) {
		return bad("worker %d outside [0, %d]", c.Worker, c.Layout.MaxWorker())
	}
	if err := idem.ValidateNamespace(c.LeaseName); err != nil || len(c.LeaseName) == 0 {
		return bad("lease name %q: [A-Za-z0-9._-], 1 to %d bytes", c.LeaseName, idem.MaxNamespaceLen)
	}
	if err := idem.ValidateLease(c.Lease); err != nil {
		return fmt.Errorf("snowflake: %w", err)
	}
	if c.Heartbeat <= 0 || c.Heartbeat > c.Lease/2 {
		return bad("heartbeat %s must be in (0, lease/2 = %s]", c.Heartbeat, c.Lease/2)
	}
	if err := idem.ValidateTTL(c.LeaseRetention); err != nil {
		return fmt.Errorf("snowflake: lease retention: %w", err)
	}
	return nil
}

// Generator makes ids for one worker id. It is safe for concurrent use;
// ids from one Generator are strictly increasing in the order Next
// returns them.
type Generator struct {
	mu      sync.Mutex
	last    int64 // last millisecond used, relative to the epoch
	seq     int64 // last sequence used in last
	closed  bool
	epochMs int64
	endMs   int64
	shift   uint  // WorkerBits + SequenceBits
	wbits   int64 // worker << SequenceBits
	maxSeq  int64
	maxBack int64 // milliseconds
	clock   idem.Clock
	cfg     Config
	lease   *lease // nil for a fixed worker
	// lease state, under mu: ids are made only before validUntil and
	// while lost is nil.
	validUntil time.Time
	lost       error
	lapsed     bool // the lapse was reported to OnLeaseLost
}

// New returns a generator. With cfg.Store set it first leases a worker id
// (ErrNoWorker when all are taken) and keeps the lease alive until Close.
func New(ctx context.Context, cfg Config) (*Generator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	l := c.Layout
	g := &Generator{
		last:    -1,
		epochMs: l.Epoch.UnixMilli(),
		endMs:   1 << l.TimeBits,
		shift:   l.WorkerBits + l.SequenceBits,
		maxSeq:  l.MaxSequence(),
		maxBack: c.MaxBackwards.Milliseconds(),
		clock:   c.Clock,
		cfg:     c,
	}
	if c.MaxBackwards < 0 {
		g.maxBack = -1
	}
	worker := c.Worker
	if c.Store != nil {
		ls, floor, err := acquire(ctx, g, c)
		if err != nil {
			return nil, err
		}
		g.lease = ls
		worker = ls.worker
		if floor >= 0 {
			g.last, g.seq = floor, g.maxSeq // the next id uses a later millisecond
		}
	}
	g.wbits = worker << l.SequenceBits
	if g.lease != nil {
		g.lease.start()
	}
	return g, nil
}

// Worker is the generator's worker id.
func (g *Generator) Worker() int64 { return g.wbits >> g.cfg.Layout.SequenceBits }

// Layout is the generator's layout (defaults filled in).
func (g *Generator) Layout() Layout { return g.cfg.Layout }

// Next returns a new id. It waits when the sequence of the current
// millisecond is used up (until the next one) and when the clock stepped
// back by at most MaxBackwards; it fails with ErrClockBackwards on a larger
// step, idem.ErrLeaseLost once the worker lease is lost or ran out,
// idem.ErrClosed after Close, and ErrExhausted past Layout.End.
func (g *Generator) Next() (ID, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, fmt.Errorf("%w: snowflake generator", idem.ErrClosed)
	}
	now := g.clock.Now()
	ms := now.UnixMilli() - g.epochMs
	if ms < 0 || ms >= g.endMs {
		return 0, g.outOfRange(now)
	}
	if ms < g.last {
		back := time.Duration(g.last-ms) * time.Millisecond
		if g.last-ms > g.maxBack {
			g.hookBack(back, false)
			return 0, &ClockBackwardsError{Back: back, Max: g.cfg.MaxBackwards}
		}
		g.hookBack(back, true)
		var ok bool
		if now, ms, ok = g.waitFor(g.last); !ok {
			return 0, &ClockBackwardsError{Back: back, Max: g.cfg.MaxBackwards}
		}
	}
	if ms == g.last {
		if g.seq < g.maxSeq {
			g.seq++
		} else {
			var ok bool
			if now, ms, ok = g.waitFor(g.last + 1); !ok {
				return 0, &ClockBackwardsError{Back: time.Millisecond, Max: g.cfg.MaxBackwards}
			}
			g.last, g.seq = ms, 0
		}
	} else {
		g.last, g.seq = ms, 0
	}
	if g.lease != nil && (g.lost != nil || !now.Before(g.validUntil)) {
		if g.lost == nil && !g.lapsed {
			g.lapsed = true
			if f := g.cfg.Hooks.OnLeaseLost; f != nil {
				f(g.Worker(), false, errLapsed)
			}
		}
		return 0, g.leaseErr()
	}
	if ms >= g.endMs {
		return 0, g.outOfRange(now)
	}
	return ID(ms<<g.shift | g.wbits | g.seq), nil
}

// NextString is Next in decimal form, e.g. as an outbox message id.
func (g *Generator) NextString() (string, error) {
	id, err := g.Next()
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(int64(id), 10), nil
}

// waitFor waits (holding mu: ids of one generator are serialised anyway)
// until the clock reaches millisecond target, sleeping while far and
// yielding while close. It gives up when that takes much longer than a
// step back we agreed to wait out.
func (g *Generator) waitFor(target int64) (time.Time, int64, bool) {
	limit := time.Now().Add(max(g.cfg.MaxBackwards, 0) + time.Second)
	for {
		now := g.clock.Now()
		ms := now.UnixMilli() - g.epochMs
		if ms >= target {
			return now, ms, true
		}
		if time.Now().After(limit) {
			return now, ms, false
		}
		if d := time.Duration(target-ms) * time.Millisecond; d > 2*time.Millisecond {
			time.Sleep(d - time.Millisecond)
		} else {
			runtime.Gosched()
		}
	}
}

func (g *Generator) outOfRange(now time.Time) error {
	return fmt.Errorf("%w: time %s outside [%s, %s)", ErrExhausted, now.UTC().Format(time.RFC3339Nano), g.cfg.Layout.Epoch, g.cfg.Layout.End())
}

func (g *Generator) hookBack(back time.Duration, waited bool) {
	if f := g.cfg.Hooks.OnClockBackwards; f != nil {
		f(back, waited)
	}
}

func (g *Generator) leaseErr() error {
	if g.lost != nil {
		return g.lost
	}
	return fmt.Errorf("%w: snowflake: worker %d lease not renewed since %s", idem.ErrLeaseLost, g.Worker(), g.validUntil.Add(-g.cfg.Lease*9/10).Format(time.RFC3339Nano))
}

// Close stops the generator: Next fails with idem.ErrClosed afterwards. A
// leased worker id is released, with the last millisecond used, so the next
// holder starts after it.
func (g *Generator) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	last := g.last
	g.mu.Unlock()
	if g.lease == nil {
		return nil
	}
	return g.lease.close(last + g.epochMs)
}
