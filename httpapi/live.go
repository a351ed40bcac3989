package httpapi

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Live figures for the dashboard (GET /v1/stats, /v1/recent), kept per
// namespace because keys and their counts belong to the namespace whose
// token asks: one-second buckets over the last liveWindow seconds (claims
// by outcome, API requests, 5xx answers, a latency histogram) and the most
// recent releases with an error and failures. The hot path is a few atomic
// adds; a bucket is reset under a lock once per second.

const (
	liveWindow  = 60 // seconds of history
	liveRecent  = 50 // failures remembered
	latBuckets  = 64 // log-scale latency buckets
	latBase     = 50 * time.Microsecond
	latGrowth   = 1.25 // bucket i holds latencies up to latBase * latGrowth^i
	latLastEdge = latBuckets - 1
)

var latLogGrowth = math.Log(latGrowth)

// latBucket is the histogram bucket of d.
func latBucket(d time.Duration) int {
	if d <= latBase {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(d)/float64(latBase)) / latLogGrowth))
	return min(i, latLastEdge)
}

// latUpper is bucket i's upper bound.
func latUpper(i int) time.Duration {
	return time.Duration(float64(latBase) * math.Pow(latGrowth, float64(i)))
}

type liveSecond struct {
	unix     atomic.Int64
	claims   [numOutcomes]atomic.Int64
	requests atomic.Int64
	errors   atomic.Int64 // 5xx answers
	lat      [latBuckets]atomic.Int64
}

// recentEvent is a key released with an error or marked failed.
type recentEvent struct {
	key   []byte
	kind  string // "released" (attempt failed, retried later) or "failed" (terminal: dead-lettered)
	cause string
	token uint64
	at    time.Time
}

type nsLive struct {
	now    func() time.Time
	rotate sync.Mutex
	secs   [liveWindow]liveSecond
	total  [numOutcomes]atomic.Int64 // since start

	mu     sync.Mutex
	recent [liveRecent]recentEvent // ring
	next   int
	n      int

	cache storeCache // records by state, in-progress page
}

// second returns the bucket of the current second, reset if it held an
// older one.
func (l *nsLive) second() *liveSecond {
	now := l.now().Unix()
	s := &l.secs[now%liveWindow]
	if s.unix.Load() != now {
		l.rotate.Lock()
		if s.unix.Load() != now {
			for i := range s.claims {
				s.claims[i].Store(0)
			}
			s.requests.Store(0)
			s.errors.Store(0)
			for i := range s.lat {
				s.lat[i].Store(0)
			}
			s.unix.Store(now)
		}
		l.rotate.Unlock()
	}
	return s
}

func (l *nsLive) claim(outcome int) {
	l.second().claims[outcome].Add(1)
	l.total[outcome].Add(1)
}

func (l *nsLive) request(code int, d time.Duration) {
	s := l.second()
	s.requests.Add(1)
	if code >= 500 {
		s.errors.Add(1)
	}
	s.lat[latBucket(d)].Add(1)
}

func (l *nsLive) failure(e recentEvent) {
	l.mu.Lock()
	l.recent[l.next] = e
	l.next = (l.next + 1) % liveRecent
	l.n = min(l.n+1, liveRecent)
	l.mu.Unlock()
}

// failures returns the remembered failures, newest first.
func (l *nsLive) failures() []recentEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]recentEvent, 0, l.n)
	for i := 1; i <= l.n; i++ {
		out = append(out, l.recent[(l.next-i+liveRecent)%liveRecent])
	}
	return out
}

// snapshot is one second's figures.
type snapshot struct {
	unix     int64
	claims   [numOutcomes]int64
	requests int64
	errors   int64
	lat      [latBuckets]int64
}

// window returns the last n complete seconds before now (oldest first)
// and the current, partial one (last). Seconds without traffic are zero.
func (l *nsLive) window(n int) []snapshot {
	now := l.now().Unix()
	out := make([]snapshot, n+1)
	for i := range out {
		t := now - int64(n) + int64(i)
		out[i].unix = t
		s := &l.secs[((t%liveWindow)+liveWindow)%liveWindow]
		if s.unix.Load() != t {
			continue
		}
		for j := range s.claims {
			out[i].claims[j] = s.claims[j].Load()
		}
		out[i].requests = s.requests.Load()
		out[i].errors = s.errors.Load()
		for j := range s.lat {
			out[i].lat[j] = s.lat[j].Load()
		}
	}
	return out
}

// quantile of a latency histogram: the upper bound of the bucket holding
// it (at most 25% above the true value), 0 when empty.
func quantile(h *[latBuckets]int64, q float64) time.Duration {
	var total int64
	for _, n := range h {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(total)))
	var seen int64
	for i, n := range h {
		seen += n
		if seen >= rank {
			return latUpper(i)
		}
	}
	return latUpper(latLastEdge)
}

// lives holds each namespace's figures.
type lives struct {
	mu  sync.Mutex
	ns  map[string]*nsLive
	now func() time.Time
}

func (ls *lives) get(ns string) *nsLive {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ns == nil {
		ls.ns = map[string]*nsLive{}
	}
	l := ls.ns[ns]
	if l == nil {
		l = &nsLive{now: ls.now}
		if l.now == nil {
			l.now = time.Now
		}
		ls.ns[ns] = l
	}
	return l
}
