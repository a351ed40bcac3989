package promidem_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// scrape gathers reg into "name{label="value",...}" -> value; histograms
// give name_count and name_sum.
func scrape(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			sort.Strings(ls)
			lab := ""
			if len(ls) > 0 {
				lab = "{" + strings.Join(ls, ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[mf.GetName()+lab] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[mf.GetName()+lab] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[mf.GetName()+"_count"+lab] = float64(m.GetHistogram().GetSampleCount())
				out[mf.GetName()+"_sum"+lab] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// want checks the given series; a missing series is an error, as is a
// value that differs.
func want(t *testing.T, got map[string]float64, exp map[string]float64) {
	t.Helper()
	keys := make([]string, 0, len(exp))
	for k := range exp {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, ok := got[normalize(k)]
		switch {
		case !ok:
			t.Errorf("%s: absent, want %v", k, exp[k])
		case v != exp[k]:
			t.Errorf("%s = %v, want %v", k, v, exp[k])
		}
	}
}

// fakeClock is a settable idem.Clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// normalize sorts the labels of a series written by hand, as scrape does.
func normalize(series string) string {
	i := strings.IndexByte(series, '{')
	if i < 0 {
		return series
	}
	ls := strings.Split(strings.TrimSuffix(series[i+1:], "}"), ",")
	sort.Strings(ls)
	return series[:i] + "{" + strings.Join(ls, ",") + "}"
}
