package httpapi

import (
	"testing"
	"time"
)

// TestLatencyQuantiles: a quantile is the upper bound of its bucket, never
// below the true value and at most 25% above it.
func TestLatencyQuantiles(t *testing.T) {
	for _, d := range []time.Duration{time.Microsecond, 50 * time.Microsecond, 51 * time.Microsecond, 730 * time.Microsecond,
		3 * time.Millisecond, 47 * time.Millisecond, 2 * time.Second} {
		up := latUpper(latBucket(d))
		if up < d || float64(up) > 1.25*float64(max(d, latBase))*1.0001 {
			t.Errorf("%s: bucket bound %s", d, up)
		}
	}
	var h [latBuckets]int64
	for i := 1; i <= 100; i++ { // 1ms .. 100ms
		h[latBucket(time.Duration(i)*time.Millisecond)]++
	}
	for _, tc := range []struct {
		q    float64
		true time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		got := quantile(&h, tc.q)
		if got < tc.true || float64(got) > 1.25*float64(tc.true) {
			t.Errorf("q%.2f = %s, want within [%s, +25%%]", tc.q, got, tc.true)
		}
	}
	if quantile(&[latBuckets]int64{}, 0.99) != 0 {
		t.Error("empty histogram: want 0")
	}
}

// TestLiveWindowRotates: a second's bucket is reused a minute later,
// reset; the window skips seconds without traffic.
func TestLiveWindowRotates(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l := &nsLive{now: func() time.Time { return now }}
	l.claim(outCompleted)
	l.request(200, time.Millisecond)
	now = now.Add(liveWindow * time.Second) // same bucket, next minute
	l.claim(outAcquired)
	w := l.window(liveWindow - 1)
	last := w[len(w)-1]
	if last.claims[outAcquired] != 1 || last.claims[outCompleted] != 0 || last.requests != 0 {
		t.Errorf("bucket not reset: %+v", last.claims)
	}
	for _, s := range w[:len(w)-1] {
		if s.requests != 0 || s.claims != [numOutcomes]int64{} {
			t.Errorf("second %d has traffic: %+v", s.unix, s)
		}
	}
	if l.total[outCompleted].Load() != 1 || l.total[outAcquired].Load() != 1 {
		t.Error("totals lost")
	}
}
