package idem

import (
	"fmt"
	"log/slog"
	"time"
)

// Defaults of a Guard.
const (
	DefaultLease = 30 * time.Second
	DefaultTTL   = 7 * 24 * time.Hour // seeds: keep records 3-7 days, >= 2x the longest redelivery
	// DefaultCompleteRetries: no count cap; a settle is retried for as long
	// as the claim's lease allows (see Held.Complete).
	DefaultCompleteRetries = 0
	// DefaultBackgroundRetry is how long the guard keeps recording a
	// completion in the background after the caller got ErrUnrecorded.
	DefaultBackgroundRetry = 15 * time.Minute
)

type guardConfig struct {
	lease           time.Duration
	ttl             time.Duration
	maxAttempts     int
	failOpen        bool
	heartbeat       time.Duration // 0: lease/3; < 0: off
	completeRetries int
	background      time.Duration // 0: DefaultBackgroundRetry; < 0: off
	redelivery      time.Duration
	logger          *slog.Logger
	clock           Clock
	hooks           []Hooks
}

func (c *guardConfig) validate() error {
	if err := ValidateLease(c.lease); err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	if err := ValidateTTL(c.ttl); err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	if c.maxAttempts < 0 {
		return fmt.Errorf("%w: guard: max attempts %d < 0", ErrInvalidArgument, c.maxAttempts)
	}
	if c.heartbeat > c.lease/2 {
		// Beats land up to a quarter interval late; half the lease leaves room
		// for that and for one failed Extend.
		return fmt.Errorf("%w: guard: heartbeat %s must be at most half the lease %s", ErrInvalidArgument, c.heartbeat, c.lease)
	}
	if c.completeRetries < 0 {
		return fmt.Errorf("%w: guard: complete retries %d < 0", ErrInvalidArgument, c.completeRetries)
	}
	return nil
}

// Option configures a Guard.
type Option func(*guardConfig)

// WithLease sets how long a claim is held before another worker may take
// over (default 30s). The heartbeat renews it while the handler runs.
func WithLease(d time.Duration) Option { return func(c *guardConfig) { c.lease = d } }

// WithTTL sets how long records are kept after a claim or completion
// (default 7 days). Keep it longer than the broker's redelivery window
// (invariant 6); see WithRedeliveryWindow.
func WithTTL(d time.Duration) Option { return func(c *guardConfig) { c.ttl = d } }

// WithMaxAttempts marks a key failed (terminal, dead-letter) once n claims
// of it ended in a handler error or a crash. 0 (the default) retries forever.
func WithMaxAttempts(n int) Option { return func(c *guardConfig) { c.maxAttempts = n } }

// WithFailOpen lets the handler run without a record when the store cannot be
// reached. Every such pass is logged and reported to Hooks.OnFailOpen. The
// default is to fail closed: no effect, return the error, let the broker
// redeliver.
func WithFailOpen(on bool) Option { return func(c *guardConfig) { c.failOpen = on } }

// WithHeartbeat sets how often a held claim's lease is extended while the
// handler runs and until the claim is settled (default lease/3). A claim
// with a shorter per-call lease (WithCallLease) is extended in the same
// proportion of its own lease. A negative interval disables it.
func WithHeartbeat(d time.Duration) Option { return func(c *guardConfig) { c.heartbeat = d } }

// WithCompleteRetries caps how many times a failed Complete, Release or
// Fail is retried in the foreground before the caller gets ErrUnrecorded
// (or the release error). The default, 0, sets no count: the guard retries
// with backoff for as long as the claim's lease allows (at most one lease
// from the first try, never past the end of the lease as last extended),
// while the heartbeat keeps extending it.
func WithCompleteRetries(n int) Option { return func(c *guardConfig) { c.completeRetries = n } }

// WithBackgroundRetry sets how long the guard keeps trying to record a
// completion (or a Fail) after the caller got ErrUnrecorded: in the
// background, with backoff, with the heartbeat still extending the lease,
// until the store records it, answers ErrFenced or ErrNotFound, the time is
// up, or Guard.Close. Default 15 minutes; negative turns it off. Each try
// is reported to Hooks.OnUnrecorded when it ends.
func WithBackgroundRetry(d time.Duration) Option { return func(c *guardConfig) { c.background = d } }

// WithRedeliveryWindow tells the guard the longest time the broker may
// redeliver a message; NewGuard logs a warning when the TTL is shorter.
func WithRedeliveryWindow(d time.Duration) Option { return func(c *guardConfig) { c.redelivery = d } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *guardConfig) { c.logger = l } }

// WithClock sets the clock the guard keeps its own view of time with
// (default the system clock): when a held claim's lease ends and its next
// heartbeat is due, the settle window, the background retry budget, and
// the durations reported to hooks. Leases themselves are timed by the
// store. It must advance with real time (the heartbeat polls in real
// time and beats when this clock says a claim is due); tests pass a manual
// clock, shared with a memstore, to make lease timing independent of how
// fast the machine runs.
func WithClock(cl Clock) Option { return func(c *guardConfig) { c.clock = cl } }

// WithHooks adds observers (see Hooks); nil fields are skipped. Several
// Hooks values may be given, in one call or several: each event goes to
// all of them in order.
func WithHooks(h ...Hooks) Option { return func(c *guardConfig) { c.hooks = append(c.hooks, h...) } }

// CallOption adjusts one Do or Acquire call.
type CallOption func(*callConfig)

type callConfig struct {
	fingerprint []byte
	lease       time.Duration
	ttl         time.Duration
}

// WithFingerprint sets the payload fingerprint of this call: a later claim
// of the same key with another fingerprint gets ErrFingerprintMismatch.
// See FingerprintOf.
func WithFingerprint(fp []byte) CallOption { return func(c *callConfig) { c.fingerprint = fp } }

// WithCallLease overrides the guard's lease for this call.
func WithCallLease(d time.Duration) CallOption { return func(c *callConfig) { c.lease = d } }

// WithCallTTL overrides the guard's TTL for this call.
func WithCallTTL(d time.Duration) CallOption { return func(c *callConfig) { c.ttl = d } }
