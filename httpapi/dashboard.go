package httpapi

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idem-dev/idem"
)

// The dashboard's endpoints (docs/http.md): GET /v1/stats and GET
// /v1/recent, with the same bearer tokens as the rest of /v1 and about the
// token's namespace only. They read this process's live figures, which
// cover the requests this instance answered (not the other instances on a
// shared store), and the store itself for records by state and keys in
// progress, cached so that any number of open dashboards cost the store
// at most one count per statsTTL and one page per listTTL.

const (
	statsTTL       = 5 * time.Second // a SQL store counts with a scan
	listTTL        = time.Second
	inProgressPage = 20
	rateSeconds    = 5 // claims/s and duplicate rate are averaged over the last complete seconds
)

// storeCache keeps the last store reads of one namespace.
type storeCache struct {
	mu      sync.Mutex
	statsAt time.Time
	stats   *recordsOut
	listAt  time.Time
	list    []inProgressOut
	more    bool
	listOK  bool
}

type recordsOut struct {
	InProgress int64 `json:"in_progress"`
	Completed  int64 `json:"completed"`
	Failed     int64 `json:"failed"`
	Released   int64 `json:"released"`
}

type latencyOut struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

type pointOut struct {
	T        int64   `json:"t"` // unix second
	Claims   int64   `json:"claims"`
	Replayed int64   `json:"replayed"`
	Requests int64   `json:"requests"`
	Errors   int64   `json:"errors"`
	P99      float64 `json:"p99_ms"`
}

type statsOut struct {
	Now time.Time `json:"now"`
	// Rates over the last rateSeconds complete seconds.
	ClaimsPerSec   float64 `json:"claims_per_s"`
	RequestsPerSec float64 `json:"requests_per_s"`
	DuplicateRate  float64 `json:"duplicate_rate"` // replayed / claims answered
	// Latency of the API's requests (claims, settles, record reads) over
	// the last rateSeconds complete seconds, from a log-scale histogram
	// (values are bucket upper bounds, within 25%).
	Latency latencyOut `json:"latency"`
	// Claims by outcome since this process started.
	Totals map[string]int64 `json:"totals"`
	// One point per second over the last minute, oldest first; the last
	// is the current, partial second.
	Series []pointOut `json:"series"`
	// Live records by state (idem.Stater), null when the store cannot
	// count; refreshed at most every 5 s.
	Records *recordsOut `json:"records"`
}

type inProgressOut struct {
	Key        *string    `json:"key,omitempty"`
	KeyB64     *string    `json:"key_b64,omitempty"`
	Token      uint64     `json:"token"`
	Attempts   int        `json:"attempts"`
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	Expired    bool       `json:"expired"`
}

type failureOut struct {
	Key    *string   `json:"key,omitempty"`
	KeyB64 *string   `json:"key_b64,omitempty"`
	Kind   string    `json:"kind"` // "released" or "failed"
	Error  string    `json:"error,omitempty"`
	Token  uint64    `json:"token"`
	At     time.Time `json:"at"`
}

type recentOut struct {
	// InProgress is the store's first page of keys in progress (live or
	// lapsed leases; idem.Lister), null when the store cannot list them.
	InProgress     []inProgressOut `json:"in_progress"`
	InProgressMore bool            `json:"in_progress_more"`
	// Failures are the latest releases with an error (the attempt failed;
	// the key is claimable again) and fails (terminal: dead-lettered)
	// answered by this process, newest first.
	Failures []failureOut `json:"failures"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (h *Handler) stats(ctx context.Context, w *recorder, store idem.Store, l *nsLive) {
	win := l.window(liveWindow - 1)
	out := statsOut{Now: l.now().UTC(), Totals: map[string]int64{}, Series: make([]pointOut, len(win))}
	var hist [latBuckets]int64
	var claims, replayed, requests int64
	for i, s := range win {
		var n int64
		for _, c := range s.claims {
			n += c
		}
		out.Series[i] = pointOut{T: s.unix, Claims: n, Replayed: s.claims[outCompleted], Requests: s.requests, Errors: s.errors, P99: ms(quantile(&s.lat, 0.99))}
		if i >= len(win)-1-rateSeconds && i < len(win)-1 {
			claims += n
			replayed += s.claims[outCompleted]
			requests += s.requests
			for j, c := range s.lat {
				hist[j] += c
			}
		}
	}
	out.ClaimsPerSec = float64(claims) / rateSeconds
	out.RequestsPerSec = float64(requests) / rateSeconds
	if claims > 0 {
		out.DuplicateRate = float64(replayed) / float64(claims)
	}
	out.Latency = latencyOut{P50: ms(quantile(&hist, 0.5)), P90: ms(quantile(&hist, 0.9)), P99: ms(quantile(&hist, 0.99)), Max: ms(quantile(&hist, 1))}
	for o, name := range outcomeNames {
		out.Totals[name] = l.total[o].Load()
	}
	out.Records = l.cache.records(ctx, store, l.now())
	writeJSON(w, 200, out)
}

// records counts the store's records by state, at most every statsTTL.
func (c *storeCache) records(ctx context.Context, store idem.Store, now time.Time) *recordsOut {
	st, ok := store.(idem.Stater)
	if !ok {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stats != nil && now.Sub(c.statsAt) < statsTTL {
		return c.stats
	}
	s, err := st.Stats(ctx)
	if err != nil {
		return c.stats // the last count, if any; the page says when it was taken
	}
	c.stats, c.statsAt = &recordsOut{InProgress: s.InProgress, Completed: s.Completed, Failed: s.Failed, Released: s.Released}, now
	return c.stats
}

// inProgress reads the first page of keys in progress, at most every
// listTTL.
func (c *storeCache) inProgress(ctx context.Context, store idem.Store, now time.Time) ([]inProgressOut, bool, error) {
	ls, ok := store.(idem.Lister)
	if !ok {
		return nil, false, errors.ErrUnsupported
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listOK && now.Sub(c.listAt) < listTTL {
		return c.list, c.more, nil
	}
	recs, cursor, err := ls.ListInProgress(ctx, "", inProgressPage)
	if err != nil {
		return nil, false, err
	}
	c.list = make([]inProgressOut, 0, len(recs))
	for _, r := range recs {
		o := inProgressOut{Token: r.Token, Attempts: r.Attempts, Expired: !r.LeaseUntil.After(now)}
		o.Key, o.KeyB64 = textOrB64(r.Key, true)
		lu := r.LeaseUntil.UTC()
		o.LeaseUntil = &lu
		c.list = append(c.list, o)
	}
	c.more, c.listAt, c.listOK = cursor != "", now, true
	return c.list, c.more, nil
}

func (h *Handler) recent(ctx context.Context, w *recorder, store idem.Store, l *nsLive) {
	out := recentOut{Failures: []failureOut{}}
	list, more, err := l.cache.inProgress(ctx, store, l.now())
	switch {
	case errors.Is(err, errors.ErrUnsupported):
	case err != nil:
		h.storeError(w, store, err)
		return
	default:
		out.InProgress, out.InProgressMore = list, more
	}
	for _, e := range l.failures() {
		f := failureOut{Kind: e.kind, Error: e.cause, Token: e.token, At: e.at.UTC()}
		f.Key, f.KeyB64 = textOrB64(e.key, true)
		out.Failures = append(out.Failures, f)
	}
	writeJSON(w, 200, out)
}

// countClaim counts a claim's outcome in the metrics and, for the
// dashboard, in the request's namespace.
func (h *Handler) countClaim(w *recorder, outcome int) {
	h.metrics.claim(outcome)
	if w.live != nil {
		w.live.claim(outcome)
	}
}

// noteSettle remembers a release with an error and a fail for the
// dashboard's recent failures.
func (w *recorder) noteSettle(op int, s settleReq) {
	if w.live == nil || (op != opFail && (op != opRelease || s.cause == "")) {
		return
	}
	kind := "released"
	if op == opFail {
		kind = "failed"
	}
	w.live.failure(recentEvent{key: append([]byte(nil), s.key...), kind: kind, cause: s.cause, token: s.token, at: w.live.now()})
}
