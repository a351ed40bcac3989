// Package deploy holds the monitoring files shipped with idem, checked
// against the metrics promidem really exports:
//
//   - prometheus/idem-rules.yml: recording rules and alerts (duplicate rate
//     over 5% as seed 001 asks, store errors and outages, store latency,
//     fail-open passes, unrecorded completions, dead letters, lost leases,
//     record count growth as seed 004 asks, outbox backlog, broker lag);
//   - grafana/idem-dashboard.json: a Grafana dashboard of the same metrics.
//
// The files are embedded (Rules, Dashboard) for tools that install them.
// See docs/observability.md.
package deploy

import _ "embed"

// Rules is prometheus/idem-rules.yml.
//
//go:embed prometheus/idem-rules.yml
var Rules []byte

// Dashboard is grafana/idem-dashboard.json.
//
//go:embed grafana/idem-dashboard.json
var Dashboard []byte
