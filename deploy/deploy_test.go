package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/deploy"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	rulesPath     = "prometheus/idem-rules.yml"
	dashboardPath = "grafana/idem-dashboard.json"
)

var promqlParser = parser.NewParser(parser.Options{})

type fakeStater struct{}

func (fakeStater) Stats(context.Context) (idem.Stats, error) { return idem.Stats{Completed: 1}, nil }

type fakeConsumer struct{}

func (fakeConsumer) Stats() consumer.Stats { return consumer.Stats{} }

type fakeLag struct{}

func (fakeLag) Lag(context.Context) (int64, error) { return 0, nil }

// httpMetrics drives an httpapi handler (idem serve's) through claims of
// each outcome, a 404 and a 503 (store down), and returns its metrics
// writer.
func httpMetrics(t *testing.T) func(io.Writer) error {
	t.Helper()
	st, err := memstore.New(memstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fs := faultstore.New(st)
	h, err := httpapi.New(httpapi.Config{Store: fs})
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, body string) map[string]any {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
		var m map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &m)
		return m
	}
	r := do("POST", "/v1/claim", `{"key":"k1","fingerprint":"YQ=="}`)
	do("POST", "/v1/complete", fmt.Sprintf(`{"key":"k1","token":%v}`, r["token"]))
	do("POST", "/v1/claim", `{"key":"k1"}`)                      // completed
	do("POST", "/v1/claim", `{"key":"k1","fingerprint":"Yg=="}`) // fingerprint_mismatch
	r = do("POST", "/v1/claim", `{"key":"k2"}`)
	do("POST", "/v1/claim", `{"key":"k2"}`) // in_progress
	do("POST", "/v1/fail", fmt.Sprintf(`{"key":"k2","token":%v}`, r["token"]))
	do("POST", "/v1/claim", `{"key":"k2"}`) // failed
	do("GET", "/nope", "")
	fs.SetDown(true)
	do("POST", "/v1/claim", `{"key":"k3"}`) // error, 503
	return h.WriteMetrics
}

// exported gathers what a promidem collector with every source plugged
// in, and idem serve's HTTP API, export: series name -> label name ->
// values (histograms also under their _bucket, _sum and _count names;
// _bucket has le).
func exported(t *testing.T) map[string]map[string][]string {
	t.Helper()
	col, err := promidem.New(promidem.Config{Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	col.WatchStore(fakeStater{})
	col.WatchConsumer(fakeConsumer{})
	col.WatchLag(fakeLag{})
	col.OutboxHooks().OnStats(context.Background(), outbox.Stats{At: time.Now()})
	col.GuardHooks()
	col.ConsumerHooks()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	mfs, err := prometheus.Gatherers{reg, promidem.TextGatherer(httpMetrics(t))}.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]string{}
	add := func(name string, m *dto.Metric, extra ...string) {
		ls := out[name]
		if ls == nil {
			ls = map[string][]string{}
			out[name] = ls
		}
		for _, lp := range m.GetLabel() {
			if !slices.Contains(ls[lp.GetName()], lp.GetValue()) {
				ls[lp.GetName()] = append(ls[lp.GetName()], lp.GetValue())
			}
		}
		for _, l := range extra {
			ls[l] = append(ls[l], "")
		}
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				add(mf.GetName()+"_bucket", m, "le")
				add(mf.GetName()+"_sum", m)
				add(mf.GetName()+"_count", m)
				continue
			}
			add(mf.GetName(), m)
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d metric names gathered", len(out))
	}
	return out
}

// exprProblems parses expr and reports every selector that names no
// exported metric (nor one of the recording rules in recorded) and every
// label matcher that cannot match: the label does not exist on that
// metric, or an equality value or a regular expression matches none of
// its exported values.
func exprProblems(expr string, metrics map[string]map[string][]string, recorded map[string]bool) []string {
	e, err := promqlParser.ParseExpr(expr)
	if err != nil {
		return []string{err.Error()}
	}
	sels := parser.ExtractSelectors(e)
	if len(sels) == 0 {
		return []string{"names no metric"}
	}
	var out []string
	for _, ms := range sels {
		var name string
		for _, m := range ms {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if recorded[name] {
			continue
		}
		ls, ok := metrics[name]
		if !ok {
			out = append(out, fmt.Sprintf("metric %q is not exported by promidem", name))
			continue
		}
		for _, m := range ms {
			if m.Name == labels.MetricName {
				continue
			}
			values, ok := ls[m.Name]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s has no label %q", name, m.Name))
			case m.Name == "idem_namespace" || m.Type == labels.MatchNotEqual || m.Type == labels.MatchNotRegexp:
			case !slices.ContainsFunc(values, m.Matches):
				out = append(out, fmt.Sprintf("%s{%s} matches none of the exported values %v", name, m, values))
			}
		}
	}
	return out
}

func checkExpr(t *testing.T, where, expr string, metrics map[string]map[string][]string, recorded map[string]bool) {
	t.Helper()
	for _, p := range exprProblems(expr, metrics, recorded) {
		t.Errorf("%s: %s\n%s", where, p, expr)
	}
}

// TestRules: the rule file decodes and validates (loadRules), every
// expression names exported
// metrics and label values, every alert has a severity, a summary and a
// description, and the alerts issue 17 asks for are there.
func TestRules(t *testing.T) {
	rgs := loadRules(t)
	metrics := exported(t)
	recorded := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	alerts := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			name := r.Record + r.Alert
			checkExpr(t, rulesPath+": "+name, r.Expr, metrics, recorded)
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: no summary or description", r.Alert)
			}
		}
	}
	for _, a := range []string{"IdemDuplicateRateHigh", "IdemHTTPDuplicateRateHigh", "IdemStoreErrors", "IdemFailOpenPasses",
		"IdemUnrecordedCompletions", "IdemUnrecordedCompletionsAbandoned", "IdemDeadLetters", "IdemRecordsGrowing"} {
		if !alerts[a] {
			t.Errorf("alert %s missing", a)
		}
	}
	if string(deploy.Rules) == "" {
		t.Error("deploy.Rules is empty")
	}
}

// dashboard is the part of Grafana's dashboard model the test reads.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ H, W, X, Y int } `json:"gridPos"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaVars replaces the dashboard's variables with PromQL a parser
// takes: $__rate_interval and $__range by durations, $namespace by the
// regular expression of "All".
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$namespace", ".*", "${namespace}", ".*")

// TestDashboard: the dashboard JSON parses; it has the datasource and
// namespace variables; every panel but rows has a query on the datasource
// variable, and every query parses and names exported metrics and label
// values (the namespace filter on every metric that has idem_namespace);
// panel ids are unique and panels do not overlap on the 24-column
// grid.
func TestDashboard(t *testing.T) {
	var d dashboard
	if err := json.Unmarshal(deploy.Dashboard, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Fatal("no uid or title")
	}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	if !slices.Contains(vars, "datasource") || !slices.Contains(vars, "namespace") {
		t.Fatalf("variables %v, want datasource and namespace", vars)
	}
	metrics := exported(t)
	recorded := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v off the grid", p.Title, p.GridPos)
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at %d,%d", p.Title, other, x, y)
				}
				used[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource is not the variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no query", p.Title)
		}
		for _, tg := range p.Targets {
			if e, err := promqlParser.ParseExpr(grafanaVars.Replace(tg.Expr)); err == nil {
				for _, ms := range parser.ExtractSelectors(e) {
					name, filtered := "", false
					for _, m := range ms {
						if m.Name == labels.MetricName {
							name = m.Value
						}
						filtered = filtered || (m.Name == "idem_namespace" && m.Value == ".*")
					}
					if _, has := metrics[name]["idem_namespace"]; has && !filtered {
						t.Errorf("panel %q, query %s: %s not filtered by the namespace variable", p.Title, tg.RefID, name)
					}
				}
			}
			checkExpr(t, fmt.Sprintf("panel %q query %s", p.Title, tg.RefID), grafanaVars.Replace(tg.Expr), metrics, recorded)
			queries++
		}
	}
	if queries < 20 {
		t.Errorf("%d queries", queries)
	}
}

// TestCheckerCatchesMistakes: the checks above fail on a misspelled
// metric, a label the metric does not have, and a label value it never
// takes (the checker is not vacuous).
func TestCheckerCatchesMistakes(t *testing.T) {
	metrics := exported(t)
	for _, expr := range []string{
		`rate(idem_claim_total[5m])`,
		`rate(idem_claims_total{result="completed"}[5m])`,
		`rate(idem_claims_total{outcome="replayed"}[5m])`,
		`rate(idem_claims_total{outcome=~"replay|dup"}[5m])`,
		`histogram_quantile(0.99, rate(idem_store_operation_duration_seconds_bucket{operation="extend"}[5m]))`,
	} {
		if len(exprProblems(expr, metrics, nil)) == 0 {
			t.Errorf("%s passed the check", expr)
		}
	}
}
