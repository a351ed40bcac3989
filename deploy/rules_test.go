package deploy_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"text/template"

	"github.com/idem-dev/idem/deploy"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// ruleFile mirrors Prometheus's rule file format (model/rulefmt), which
// TestRulesLoadInPrometheus (-tags alerteval) loads with Prometheus's own
// code; the default run decodes it strictly with this, which builds in
// seconds where rulefmt pulls in the query engine.
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval,omitempty"`
		Limit    int    `yaml:"limit,omitempty"`
		Rules    []struct {
			Record        string            `yaml:"record,omitempty"`
			Alert         string            `yaml:"alert,omitempty"`
			Expr          string            `yaml:"expr"`
			For           string            `yaml:"for,omitempty"`
			KeepFiringFor string            `yaml:"keep_firing_for,omitempty"`
			Labels        map[string]string `yaml:"labels,omitempty"`
			Annotations   map[string]string `yaml:"annotations,omitempty"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// templateFuncs stands for the functions Prometheus offers alert
// templates (template.NewTemplateExpander): parsing needs their names.
var templateFuncs = func() template.FuncMap {
	m := template.FuncMap{}
	for _, name := range []string{"query", "first", "label", "value", "strvalue", "args", "reReplaceAll",
		"safeHtml", "match", "title", "toUpper", "toLower", "graphLink", "tableLink", "sortByLabel",
		"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp",
		"toTime", "toDuration", "now", "pathPrefix", "externalURL", "parseDuration", "stripPort",
		"stripDomain", "urlQueryEscape"} {
		m[name] = func(...any) string { return "" }
	}
	return m
}()

// loadRules decodes the rule file strictly (unknown fields are errors)
// and checks what Prometheus checks on load: unique group names, one of
// record and alert per rule, valid names, expressions that parse,
// durations that parse, label names, templates that parse.
func loadRules(t *testing.T) ruleFile {
	t.Helper()
	rf, problems := parseRules(deploy.Rules)
	for _, p := range problems {
		t.Error(p)
	}
	if len(problems) > 0 {
		t.FailNow()
	}
	return rf
}

func parseRules(data []byte) (rf ruleFile, problems []string) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		return rf, []string{fmt.Sprintf("%s: %v", rulesPath, err)}
	}
	errorf := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	groups := map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || groups[g.Name] {
			errorf("group name %q empty or repeated", g.Name)
		}
		groups[g.Name] = true
		if len(g.Rules) == 0 {
			errorf("group %s has no rules", g.Name)
		}
		for i, r := range g.Rules {
			where := fmt.Sprintf("%s: group %s rule %d (%s%s)", rulesPath, g.Name, i, r.Record, r.Alert)
			switch {
			case (r.Record == "") == (r.Alert == ""):
				errorf("%s: exactly one of record and alert", where)
			case r.Record != "" && !model.IsValidLegacyMetricName(r.Record):
				errorf("%s: invalid record name", where)
			case r.Record != "" && (r.For != "" || len(r.Annotations) > 0):
				errorf("%s: a recording rule with for or annotations", where)
			}
			if _, err := promqlParser.ParseExpr(r.Expr); err != nil {
				errorf("%s: %v", where, err)
			}
			for _, d := range []string{r.For, r.KeepFiringFor, g.Interval} {
				if _, err := model.ParseDuration(d); d != "" && err != nil {
					errorf("%s: duration %q: %v", where, d, err)
				}
			}
			for k := range r.Labels {
				if !model.LabelName(k).IsValidLegacy() {
					errorf("%s: label name %q", where, k)
				}
			}
			for k, v := range r.Annotations {
				defs := "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
				if _, err := template.New(k).Funcs(templateFuncs).Parse(defs + v); err != nil {
					errorf("%s: annotation %s: %v", where, k, err)
				}
				if strings.Contains(v, "{{ $labels.") && !strings.Contains(r.Expr, "by (") {
					errorf("%s: annotation %s uses labels the aggregation drops", where, k)
				}
			}
		}
	}
	return rf, problems
}

// TestRuleLoaderCatchesMistakes: the default run's loader rejects what
// Prometheus would: a misspelled field, an expression that does not
// parse, a template function that does not exist, a rule both record
// and alert, a bad duration.
func TestRuleLoaderCatchesMistakes(t *testing.T) {
	for _, bad := range []string{
		"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    anotations: {summary: x}\n",
		"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum by (x) (rate(up[5m])\n",
		"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum by (x) (up)\n    annotations: {summary: '{{ $value | humanizePercent }}'}\n",
		"groups:\n- name: g\n  rules:\n  - alert: A\n    record: b\n    expr: up\n",
		"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    for: 10 minutes\n",
	} {
		if _, problems := parseRules([]byte(bad)); len(problems) == 0 {
			t.Errorf("accepted:\n%s", bad)
		}
	}
}
