// Package dashboard is the web dashboard `idem serve` shows at /: live
// throughput, duplicate rate and latency percentiles of the HTTP API, keys
// in progress, the latest failed and dead-lettered keys, and a key search
// showing its record.
//
// It is plain HTML, CSS and JavaScript embedded in the binary (no build
// step), reading the API's own JSON endpoints: GET /v1/stats, /v1/recent
// and /v1/records (see docs/http.md). When the server requires bearer
// tokens, the page asks for one and sends it with each request (kept in the
// browser tab's sessionStorage); it sees that token's namespace only.
//
//	h, _ := httpapi.New(httpapi.Config{Store: store, Dashboard: dashboard.Handler()})
package dashboard
