//go:build alerteval

// Loading the rules with Prometheus's own code and evaluating the alerts
// builds its query engine and test storage (a minute or two of compiling
// on a cold cache), so they run on demand:
//
//	go test -tags alerteval ./deploy
//
// The default run decodes the rule file strictly and checks its syntax
// and metric names.

package deploy_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"

	"github.com/prometheus/prometheus/promql/promqltest"
)

// TestRulesLoadInPrometheus: the rule file loads with Prometheus's own
// loader (rulefmt: YAML, PromQL, templates with Prometheus's functions).
func TestRulesLoadInPrometheus(t *testing.T) {
	_, errs := rulefmt.ParseFile(rulesPath, false, model.UTF8Validation, promqlParser, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Error(err)
	}
}

// alertCase is a set of series (promqltest's load syntax) and whether an
// alert's expression selects anything at the end of them.
type alertCase struct {
	alert string
	load  string
	at    time.Duration // from the start of the series
	fires bool
}

const ns = `idem_namespace="orders"`

var alertCases = []alertCase{
	{"IdemDuplicateRateHigh", `load 1m
		idem_claims_total{` + ns + `,outcome="completed"} 0+6x30
		idem_claims_total{` + ns + `,outcome="acquired"} 0+94x30
		idem_claims_total{` + ns + `,outcome="error"} 0+50x30`, 30 * time.Minute, true},
	{"IdemDuplicateRateHigh", `load 1m
		idem_claims_total{` + ns + `,outcome="completed"} 0+4x30
		idem_claims_total{` + ns + `,outcome="acquired"} 0+96x30`, 30 * time.Minute, false},
	{"IdemHTTPDuplicateRateHigh", `load 1m
		idem_http_claims_total{job="serve",outcome="completed"} 0+6x30
		idem_http_claims_total{job="serve",outcome="acquired"} 0+94x30`, 30 * time.Minute, true},
	{"IdemHTTPDuplicateRateHigh", `load 1m
		idem_http_claims_total{job="serve",outcome="completed"} 0+4x30
		idem_http_claims_total{job="serve",outcome="acquired"} 0+96x30
		idem_http_claims_total{job="serve",outcome="error"} 0+50x30`, 30 * time.Minute, false},
	{"IdemHTTPServerErrors", `load 1m
		idem_http_requests_total{job="serve",route="claim",code="503"} 0+10x10
		idem_http_requests_total{job="serve",route="claim",code="201"} 0+90x10`, 10 * time.Minute, true},
	{"IdemHTTPServerErrors", `load 1m
		idem_http_requests_total{job="serve",route="claim",code="409"} 0+10x10
		idem_http_requests_total{job="serve",route="claim",code="201"} 0+90x10`, 10 * time.Minute, false},
	{"IdemStoreErrors", `load 1m
		idem_store_errors_total{` + ns + `,operation="complete",class="unknown_outcome"} 0+1x30`, 30 * time.Minute, true},
	{"IdemStoreErrors", `load 1m
		idem_store_errors_total{` + ns + `,operation="complete",class="unknown_outcome"} 0x30`, 30 * time.Minute, false},
	{"IdemStoreDown", `load 1m
		idem_store_errors_total{` + ns + `,operation="claim",class="unavailable"} 0+60x10
		idem_claims_total{` + ns + `,outcome="error"} 0+60x10
		idem_claims_total{` + ns + `,outcome="acquired"} 0+10x10`, 10 * time.Minute, true},
	{"IdemStoreDown", `load 1m
		idem_store_errors_total{` + ns + `,operation="claim",class="unavailable"} 0+1x10
		idem_claims_total{` + ns + `,outcome="error"} 0+1x10
		idem_claims_total{` + ns + `,outcome="acquired"} 0+100x10`, 10 * time.Minute, false},
	{"IdemStoreLatencyHigh", `load 1m
		idem_store_operation_duration_seconds_bucket{` + ns + `,operation="claim",le="0.05"} 0+90x30
		idem_store_operation_duration_seconds_bucket{` + ns + `,operation="claim",le="0.1"} 0+100x30
		idem_store_operation_duration_seconds_bucket{` + ns + `,operation="claim",le="+Inf"} 0+100x30`, 30 * time.Minute, true},
	{"IdemStoreLatencyHigh", `load 1m
		idem_store_operation_duration_seconds_bucket{` + ns + `,operation="claim",le="0.05"} 0+100x30
		idem_store_operation_duration_seconds_bucket{` + ns + `,operation="claim",le="0.1"} 0+100x30
		idem_store_operation_duration_seconds_bucket{` + ns + `,operation="claim",le="+Inf"} 0+100x30`, 30 * time.Minute, false},
	{"IdemFailOpenPasses", `load 1m
		idem_fail_open_passes_total{` + ns + `} 0 0 0 1 1 1`, 5 * time.Minute, true},
	{"IdemFailOpenPasses", `load 1m
		idem_fail_open_passes_total{` + ns + `} 0x5`, 5 * time.Minute, false},
	{"IdemUnrecordedCompletionsAbandoned", `load 1m
		idem_unrecorded_completions_total{` + ns + `,phase="abandoned"} 0 0 1 1 1
		idem_unrecorded_completions_total{` + ns + `,phase="pending"} 0 1 1 1 1`, 4 * time.Minute, true},
	{"IdemUnrecordedCompletionsAbandoned", `load 1m
		idem_unrecorded_completions_total{` + ns + `,phase="abandoned"} 0x4
		idem_unrecorded_completions_total{` + ns + `,phase="recovered"} 0 0 1 1 1`, 4 * time.Minute, false},
	{"IdemUnrecordedCompletions", `load 1m
		idem_unrecorded_completions_total{` + ns + `,phase="pending"} 0 1 1 1 1`, 4 * time.Minute, true},
	{"IdemDeadLetters", `load 1m
		idem_consumer_dead_letters_total{` + ns + `,result="published"} 0 0 1 1`, 3 * time.Minute, true},
	{"IdemDeadLetters", `load 1m
		idem_consumer_dead_letters_total{` + ns + `,result="publish_failed"} 0 0 1 1`, 3 * time.Minute, false},
	{"IdemDeadLetterPublishFailing", `load 1m
		idem_consumer_dead_letters_total{` + ns + `,result="publish_failed"} 0 0 1 1`, 3 * time.Minute, true},
	{"IdemLeasesLost", `load 1m
		idem_leases_lost_total{` + ns + `} 0 0 2 2`, 3 * time.Minute, true},
	{"IdemRecordsGrowing", `load 1h
		idem_records{` + ns + `,state="completed"} 100+10x48
		idem_records{` + ns + `,state="in_progress"} 5x48`, 48 * time.Hour, true},
	{"IdemRecordsGrowing", `load 1h
		idem_records{` + ns + `,state="completed"} 100+1x48
		idem_records{` + ns + `,state="in_progress"} 5x48`, 48 * time.Hour, false},
	{"IdemRecordsNotCounted", `load 1m
		idem_poll_errors_total{` + ns + `,source="store"} 0 1 2 3`, 3 * time.Minute, true},
	{"IdemConsumerHolding", `load 1m
		idem_consumer_held_messages{` + ns + `} 3x10`, 10 * time.Minute, true},
	{"IdemOutboxBacklogOld", `load 1m
		idem_outbox_oldest_pending_age_seconds{` + ns + `} 600x10`, 10 * time.Minute, true},
	{"IdemOutboxBacklogOld", `load 1m
		idem_outbox_oldest_pending_age_seconds{` + ns + `} 2x10`, 10 * time.Minute, false},
	{"IdemOutboxFailedMessages", `load 1m
		idem_outbox_messages{` + ns + `,status="failed"} 1x10
		idem_outbox_messages{` + ns + `,status="pending"} 0x10`, 10 * time.Minute, true},
	{"IdemBrokerLagGrowing", `load 1m
		idem_broker_lag_messages{` + ns + `} 0+100x30`, 30 * time.Minute, true},
	{"IdemBrokerLagGrowing", `load 1m
		idem_broker_lag_messages{` + ns + `} 3000x30`, 30 * time.Minute, false},
}

// TestAlertsFire evaluates each alert's expression with Prometheus's
// engine on synthetic series: it selects something above its threshold
// (a 6% duplicate rate, a 50 ms+ claim P99, records up 93% in a day, ...)
// and nothing below it (4%, under 50 ms, up 16%, ...). "for" durations are
// Prometheus's own business and are not evaluated. Every alert of the
// file has at least one firing case.
func TestAlertsFire(t *testing.T) {
	exprs := map[string]string{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				exprs[r.Alert] = r.Expr
			}
		}
	}
	engine := promqltest.NewTestEngine(t, false, 0, 1_000_000)
	covered := map[string]bool{}
	for _, c := range alertCases {
		expr, ok := exprs[c.alert]
		if !ok {
			t.Errorf("no alert %s", c.alert)
			continue
		}
		st := promqltest.LoadedStorage(t, c.load)
		q, err := engine.NewInstantQuery(context.Background(), st, nil, expr, time.Unix(0, 0).Add(c.at))
		if err != nil {
			t.Fatalf("%s: %v", c.alert, err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("%s: %v", c.alert, res.Err)
		}
		v, err := res.Vector()
		if err != nil {
			t.Fatalf("%s: %v", c.alert, err)
		}
		if fired := len(v) > 0; fired != c.fires {
			t.Errorf("%s fired=%v, want %v on\n%s\nresult: %v", c.alert, fired, c.fires, c.load, v)
		}
		for _, s := range v {
			if s.Metric.Get("idem_namespace") != "orders" && s.Metric.Get("job") != "serve" {
				t.Errorf("%s: result %v lost the idem_namespace (or job) label", c.alert, s.Metric)
			}
		}
		if c.fires {
			covered[c.alert] = true
		}
		q.Close()
		_ = st.Close()
	}
	for a := range exprs {
		if !covered[a] {
			t.Errorf("alert %s has no firing case", a)
		}
	}
}
