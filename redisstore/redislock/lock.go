package redislock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/rediserr"
	"github.com/idem-dev/idem/internal/redisx/script"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotAcquired: another owner holds the lock.
	ErrNotAcquired = errors.New("redislock: lock held by another owner")
	// ErrNotHeld: the caller no longer owns the lock (it expired, was taken
	// over or released); nothing was changed.
	ErrNotHeld = errors.New("redislock: lock not held")
)

// Defaults applied to zero Config fields.
const (
	DefaultPrefix         = "idemlock:"
	DefaultTTL            = 30 * time.Second
	DefaultRetryMin       = 5 * time.Millisecond
	DefaultRetryMax       = 250 * time.Millisecond
	DefaultFenceRetention = 7 * 24 * time.Hour
)

// Config configures a Locker. Client is required.
type Config struct {
	Client redis.UniversalClient
	// Prefix starts every key (default "idemlock:"); no '{' or '}'.
	Prefix string
	// TTL is the default lease of a lock (default 30s).
	TTL time.Duration
	// RetryMin and RetryMax bound Acquire's jittered exponential backoff
	// (defaults 5ms and 250ms).
	RetryMin, RetryMax time.Duration
	// Reentrant lets an owner that already holds a lock acquire it again
	// (with WithOwner); each acquisition needs its own Release.
	Reentrant bool
	// FenceRetention is how long a name's fencing counter is kept after the
	// last acquisition (default 7 days).
	FenceRetention time.Duration
	// Logger gets watchdog warnings (default slog.Default()).
	Logger *slog.Logger
}

// Validate reports a configuration error (wrapping idem.ErrInvalidArgument).
func (c Config) Validate() error {
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: redislock: Config.Client is nil", idem.ErrInvalidArgument)
	case strings.ContainsAny(c.Prefix, "{}"):
		return fmt.Errorf("%w: redislock: Prefix %q must not contain '{' or '}'", idem.ErrInvalidArgument, c.Prefix)
	case c.TTL < 0 || c.TTL > 0 && c.TTL < time.Millisecond:
		return fmt.Errorf("%w: redislock: TTL %s below 1ms", idem.ErrInvalidArgument, c.TTL)
	case c.RetryMin < 0 || c.RetryMax < 0 || c.RetryMax > 0 && c.RetryMin > c.RetryMax:
		return fmt.Errorf("%w: redislock: bad retry bounds [%s, %s]", idem.ErrInvalidArgument, c.RetryMin, c.RetryMax)
	case c.FenceRetention < 0:
		return fmt.Errorf("%w: redislock: FenceRetention %s < 0", idem.ErrInvalidArgument, c.FenceRetention)
	}
	return nil
}

// Locker hands out locks. Safe for concurrent use.
type Locker struct{ cfg Config }

// New validates cfg and applies defaults.
func New(cfg Config) (*Locker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin = DefaultRetryMin
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryMin)
	}
	if cfg.FenceRetention == 0 {
		cfg.FenceRetention = DefaultFenceRetention
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Locker{cfg: cfg}, nil
}

// Option adjusts one acquisition.
type Option func(*options)

type options struct {
	owner string
	ttl   time.Duration
}

// WithOwner sets the owner token (default: 128 random bits). Needed for
// reentrancy: the same owner acquires again.
func WithOwner(owner string) Option { return func(o *options) { o.owner = owner } }

// WithTTL sets this lock's lease instead of Config.TTL.
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// Lock is one acquisition.
type Lock struct {
	l     *Locker
	Name  string
	Owner string
	// Fence is the fencing token: larger than that of every earlier
	// acquisition of Name (a reentrant acquisition gets the holder's).
	Fence uint64
	// Count is the hold count after this acquisition (1 unless reentrant).
	Count int
	ttl   time.Duration
	key   string
	meta  string

	mu       sync.Mutex
	wdCancel context.CancelFunc
	wdDone   chan struct{}
	lost     chan struct{}
	lostErr  error
}

// acquireScript: KEYS lock, meta. ARGV owner, ttl ms, reentrant, retention
// ms. Returns {1, fence, count} or {0, pttl}. The fencing counter lives in
// the meta hash (field q); t is the current hold's fence, n its count.
var acquireScript = script.New(`
local tm = redis.call('TIME')
local nowus = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local ttl, keep = tonumber(ARGV[2]), math.max(tonumber(ARGV[4]), tonumber(ARGV[2]))
local cur = redis.call('GET', KEYS[1])
if cur then
  if cur == ARGV[1] and ARGV[3] == '1' then
    local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], keep)
    return {1, redis.call('HGET', KEYS[2], 't'), n}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local c = tonumber(redis.call('HGET', KEYS[2], 'q') or '0')
if c < nowus then c = nowus else c = c + 1 end
local f = string.format('%.0f', c)
redis.call('HSET', KEYS[2], 'q', f, 't', f, 'n', 1)
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl)
return {1, f, 1}
`)

// ownerCheck is the prefix of release and extend: owner and fence match.
const ownerCheck = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('HGET', KEYS[2], 't') ~= ARGV[2] then return -1 end
`

// releaseScript: KEYS lock, meta. ARGV owner, fence. Returns the remaining
// hold count (0: released) or -1 not held.
var releaseScript = script.New(ownerCheck + `
local n = redis.call('HINCRBY', KEYS[2], 'n', -1)
if n > 0 then return n end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'n', 0)
return 0
`)

// extendScript: KEYS lock, meta. ARGV owner, fence, ttl ms, retention ms.
// Returns 1 or -1 not held.
var extendScript = script.New(ownerCheck + `
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[3]), tonumber(ARGV[4])))
return 1
`)

// msCeil is d in milliseconds rounded up: PX counts from the server's
// clock when the command runs, so a lock never lives shorter than asked.
func msCeil(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func (l *Locker) keys(name string) (string, string, error) {
	if name == "" || strings.ContainsAny(name, "{}") || len(name) > idem.MaxKeyLen {
		return "", "", fmt.Errorf("%w: redislock: lock name %q must be 1..%d bytes without '{' or '}'", idem.ErrInvalidArgument, name, idem.MaxKeyLen)
	}
	k := l.cfg.Prefix + "{" + name + "}"
	return k, k + ":m", nil
}

// TryAcquire takes the lock once: ErrNotAcquired if another owner holds it.
func (l *Locker) TryAcquire(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	lk, _, err := l.try(ctx, name, opts)
	return lk, err
}

// Acquire waits for the lock, retrying with jittered backoff (never longer
// than the holder's remaining TTL) until ctx ends.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	backoff := l.cfg.RetryMin
	for {
		lk, pttl, err := l.try(ctx, name, opts)
		if !errors.Is(err, ErrNotAcquired) {
			return lk, err
		}
		d := time.Duration(rand.Int64N(int64(backoff)) + 1)
		if pttl > 0 && d > pttl {
			d = pttl
		}
		backoff = min(2*backoff, l.cfg.RetryMax)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: %w", ErrNotAcquired, ctx.Err())
		case <-t.C:
		}
	}
}

func (l *Locker) try(ctx context.Context, name string, opts []Option) (*Lock, time.Duration, error) {
	key, meta, err := l.keys(name)
	if err != nil {
		return nil, 0, err
	}
	o := options{ttl: l.cfg.TTL}
	for _, f := range opts {
		f(&o)
	}
	if o.ttl < time.Millisecond {
		return nil, 0, fmt.Errorf("%w: redislock: TTL %s below 1ms", idem.ErrInvalidArgument, o.ttl)
	}
	if o.owner == "" {
		var b [16]byte
		_, _ = crand.Read(b[:])
		o.owner = hex.EncodeToString(b[:])
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	re := "0"
	if l.cfg.Reentrant {
		re = "1"
	}
	v, err := acquireScript.Run(ctx, l.cfg.Client, []string{key, meta},
		o.owner, msCeil(o.ttl), re, msCeil(l.cfg.FenceRetention)).Slice()
	if err != nil {
		return nil, 0, rediserr.Map(ctx, err, "redislock: acquire", true)
	}
	if len(v) < 2 {
		return nil, 0, fmt.Errorf("redislock: acquire: unexpected reply %v", v)
	}
	if ok, _ := v[0].(int64); ok != 1 {
		pttl, _ := v[1].(int64)
		return nil, time.Duration(pttl) * time.Millisecond, fmt.Errorf("%w: %q", ErrNotAcquired, name)
	}
	fs, _ := v[1].(string)
	fence, err := strconv.ParseUint(fs, 10, 64)
	if err != nil || len(v) != 3 {
		return nil, 0, fmt.Errorf("redislock: acquire: unexpected reply %v", v)
	}
	n, _ := v[2].(int64)
	return &Lock{l: l, Name: name, Owner: o.owner, Fence: fence, Count: int(n), ttl: o.ttl,
		key: key, meta: meta, lost: make(chan struct{})}, 0, nil
}

// Release gives one hold back (the lock is free when the count reaches 0)
// and stops the watchdog. ErrNotHeld if the lock was lost.
func (k *Lock) Release(ctx context.Context) error {
	k.StopWatchdog()
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := releaseScript.Run(ctx, k.l.cfg.Client, []string{k.key, k.meta}, k.Owner, strconv.FormatUint(k.Fence, 10)).Int64()
	if err != nil {
		return rediserr.Map(ctx, err, "redislock: release", true)
	}
	if n < 0 {
		return fmt.Errorf("%w: %q fence %d", ErrNotHeld, k.Name, k.Fence)
	}
	return nil
}

// Extend sets the lock's remaining TTL to ttl (0: the lock's own TTL).
// ErrNotHeld if the lock was lost.
func (k *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		ttl = k.ttl
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: redislock: TTL %s below 1ms", idem.ErrInvalidArgument, ttl)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := extendScript.Run(ctx, k.l.cfg.Client, []string{k.key, k.meta}, k.Owner,
		strconv.FormatUint(k.Fence, 10), msCeil(ttl), msCeil(k.l.cfg.FenceRetention)).Int64()
	if err != nil {
		return rediserr.Map(ctx, err, "redislock: extend", true)
	}
	if n < 0 {
		return fmt.Errorf("%w: %q fence %d", ErrNotHeld, k.Name, k.Fence)
	}
	return nil
}

// StartWatchdog renews the lock every TTL/3 until ctx ends, Release or
// StopWatchdog is called, or the lock is lost; then Lost is closed. A
// renewal that fails for a transient reason is retried at the next tick;
// once a full TTL has passed without a successful renewal the lock is
// counted as lost. Calling it again while it runs does nothing.
func (k *Lock) StartWatchdog(ctx context.Context) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.wdCancel != nil || k.lostErr != nil {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	k.wdCancel, k.wdDone = cancel, make(chan struct{})
	go k.watch(wctx, k.wdDone)
}

func (k *Lock) watch(ctx context.Context, done chan struct{}) {
	defer close(done)
	every := max(k.ttl/3, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := k.Extend(ctx, k.ttl)
		switch {
		case err == nil:
			last = time.Now()
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrNotHeld):
			k.markLost(err)
			return
		case time.Since(last) >= k.ttl:
			k.markLost(fmt.Errorf("%w: no renewal for %s: %w", ErrNotHeld, time.Since(last).Round(time.Millisecond), err))
			return
		default:
			k.l.cfg.Logger.Warn("redislock: renewal failed, retrying", "name", k.Name, "err", err)
		}
	}
}

func (k *Lock) markLost(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lostErr == nil {
		k.lostErr = err
		close(k.lost)
	}
}

// StopWatchdog stops the watchdog (if any) and waits for it to exit.
func (k *Lock) StopWatchdog() {
	k.mu.Lock()
	cancel, done := k.wdCancel, k.wdDone
	k.wdCancel, k.wdDone = nil, nil
	k.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Lost is closed when the watchdog finds the lock gone (taken over,
// expired or deleted). The holder must stop work that relies on the lock.
func (k *Lock) Lost() <-chan struct{} { return k.lost }

// Err says why Lost was closed (nil while it is open).
func (k *Lock) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lostErr
}
