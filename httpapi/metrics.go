package httpapi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
)

// Status codes counted one by one; the rest fall under "other".
var countedCodes = [...]int{200, 201, 204, 400, 401, 404, 405, 409, 413, 422, 499, 500, 503}

const numCodes = len(countedCodes) + 1

func codeIndex(code int) int {
	for i, c := range countedCodes {
		if c == code {
			return i
		}
	}
	return len(countedCodes)
}

// Latency buckets in seconds (upper bounds).
var buckets = [...]float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Claim outcomes counted.
const (
	outAcquired = iota
	outCompleted
	outInProgress
	outFailed
	outMismatch
	outError
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"acquired", "completed", "in_progress", "failed", "fingerprint_mismatch", "error"}

func outcomeOf(err error, o idem.Outcome) int {
	switch {
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return outMismatch
	case err != nil:
		return outError
	case o == idem.OutcomeAcquired:
		return outAcquired
	case o == idem.OutcomeCompleted:
		return outCompleted
	case o == idem.OutcomeInProgress:
		return outInProgress
	case o == idem.OutcomeFailed:
		return outFailed
	}
	return outError
}

// metrics are lock-free counters, written out in the Prometheus text
// format by WriteMetrics. No label takes a key or a namespace: label sets
// stay bounded.
type metrics struct {
	requests [numRoutes][numCodes]atomic.Int64
	hist     [numRoutes][len(buckets) + 1]atomic.Int64 // non-cumulative; last is +Inf
	sumNanos [numRoutes]atomic.Int64
	claims   [numOutcomes]atomic.Int64
	inFlight atomic.Int64
}

func (m *metrics) observe(route, code int, d time.Duration) {
	m.requests[route][codeIndex(code)].Add(1)
	s := d.Seconds()
	i := 0
	for i < len(buckets) && s > buckets[i] {
		i++
	}
	m.hist[route][i].Add(1)
	m.sumNanos[route].Add(int64(d))
}

func (m *metrics) claim(outcome int) { m.claims[outcome].Add(1) }

// WriteMetrics writes the handler's counters in the Prometheus text
// exposition format (version 0.0.4): idem_http_requests_total{route,code},
// idem_http_request_duration_seconds{route} (histogram),
// idem_http_claims_total{outcome} (each batch entry counts) and
// idem_http_in_flight_requests.
func (h *Handler) WriteMetrics(w io.Writer) error {
	m := &h.metrics
	bw := bufio.NewWriter(w)
	fmt.Fprint(bw, "# HELP idem_http_requests_total HTTP requests answered, by route and status code.\n# TYPE idem_http_requests_total counter\n")
	for r := range numRoutes {
		for c := range numCodes {
			n := m.requests[r][c].Load()
			if n == 0 {
				continue
			}
			code := "other"
			if c < len(countedCodes) {
				code = strconv.Itoa(countedCodes[c])
			}
			fmt.Fprintf(bw, "idem_http_requests_total{route=%q,code=%q} %d\n", routeNames[r], code, n)
		}
	}
	fmt.Fprint(bw, "# HELP idem_http_request_duration_seconds Time to answer an HTTP request, by route.\n# TYPE idem_http_request_duration_seconds histogram\n")
	for r := range numRoutes {
		var counts [len(buckets) + 1]int64
		total := int64(0)
		for i := range counts {
			counts[i] = m.hist[r][i].Load()
			total += counts[i]
		}
		if total == 0 {
			continue
		}
		cum := int64(0)
		for i, b := range buckets {
			cum += counts[i]
			fmt.Fprintf(bw, "idem_http_request_duration_seconds_bucket{route=%q,le=%q} %d\n", routeNames[r], strconv.FormatFloat(b, 'g', -1, 64), cum)
		}
		fmt.Fprintf(bw, "idem_http_request_duration_seconds_bucket{route=%q,le=\"+Inf\"} %d\n", routeNames[r], total)
		fmt.Fprintf(bw, "idem_http_request_duration_seconds_sum{route=%q} %s\n", routeNames[r], strconv.FormatFloat(time.Duration(m.sumNanos[r].Load()).Seconds(), 'g', -1, 64))
		fmt.Fprintf(bw, "idem_http_request_duration_seconds_count{route=%q} %d\n", routeNames[r], total)
	}
	fmt.Fprint(bw, "# HELP idem_http_claims_total Claims answered over HTTP (each batch entry counts), by outcome.\n# TYPE idem_http_claims_total counter\n")
	for o := range numOutcomes {
		fmt.Fprintf(bw, "idem_http_claims_total{outcome=%q} %d\n", outcomeNames[o], m.claims[o].Load())
	}
	fmt.Fprintf(bw, "# HELP idem_http_in_flight_requests HTTP requests being answered.\n# TYPE idem_http_in_flight_requests gauge\nidem_http_in_flight_requests %d\n", m.inFlight.Load())
	return bw.Flush()
}
