package outbox

import (
	"fmt"
	"math"
	"time"
)

// Backoff is the retry schedule after a failed publish: the seed's
// Math.min(max, initial * multiplier^(attempt-1)), plus up to Jitter of it
// at random so that messages failed together do not retry together.
type Backoff struct {
	Initial    time.Duration // default 1s
	Multiplier float64       // default 1.5
	Max        time.Duration // default 10s
	// Jitter adds a random fraction in [0, Jitter) of the delay (default
	// 0.1; negative: none). The delay can thus exceed Max by that fraction.
	Jitter float64
}

// MaxBackoff is the largest Backoff.Max a relay accepts: a longer wait is
// an operator's matter (MaxAttempts, then Requeue), and with the jitter it
// stays far from what a Duration or a backend's clock arithmetic holds.
const MaxBackoff = 24 * time.Hour

// Seed 000's schedule.
const (
	DefaultBackoffInitial    = time.Second
	DefaultBackoffMultiplier = 1.5
	DefaultBackoffMax        = 10 * time.Second
	DefaultBackoffJitter     = 0.1
)

func (b Backoff) withDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = DefaultBackoffInitial
	}
	if b.Multiplier == 0 {
		b.Multiplier = DefaultBackoffMultiplier
	}
	if b.Max == 0 {
		b.Max = DefaultBackoffMax
	}
	if b.Jitter == 0 {
		b.Jitter = DefaultBackoffJitter
	}
	if b.Jitter < 0 {
		b.Jitter = 0
	}
	return b
}

// Validate checks the schedule after defaults.
func (b Backoff) Validate() error {
	b = b.withDefaults()
	switch {
	case b.Initial < time.Millisecond:
		return invalid("backoff initial %s < 1ms", b.Initial)
	case b.Multiplier < 1 || math.IsNaN(b.Multiplier) || math.IsInf(b.Multiplier, 0):
		return invalid("backoff multiplier %v < 1", b.Multiplier)
	case b.Max < b.Initial:
		return invalid("backoff max %s < initial %s", b.Max, b.Initial)
	case b.Max > MaxBackoff:
		return invalid("backoff max %s > %s", b.Max, MaxBackoff)
	case b.Jitter > 1:
		return invalid("backoff jitter %v > 1", b.Jitter)
	}
	return nil
}

// Delay is the wait after the attempt-th failed attempt (attempt >= 1),
// with rnd in [0, 1) choosing the jitter.
func (b Backoff) Delay(attempt int, rnd float64) time.Duration {
	b = b.withDefaults()
	d := float64(b.Initial) * math.Pow(b.Multiplier, float64(max(attempt, 1)-1))
	if d > float64(b.Max) || math.IsInf(d, 0) {
		d = float64(b.Max)
	}
	if d *= 1 + b.Jitter*rnd; d >= math.MaxInt64 {
		return math.MaxInt64 // a Backoff Validate refuses; never negative
	}
	return time.Duration(d)
}

func (b Backoff) String() string {
	b = b.withDefaults()
	return fmt.Sprintf("%s x%v max %s jitter %v", b.Initial, b.Multiplier, b.Max, b.Jitter)
}
