package promidem

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TextGatherer is a prometheus.Gatherer over metrics that something writes
// in the Prometheus text format (httpapi.Handler.WriteMetrics, say), so
// they can be served beside a registry's through prometheus.Gatherers:
//
//	g := prometheus.Gatherers{reg, promidem.TextGatherer(h.WriteMetrics)}
//	http.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
//
// Each Gather calls write and parses what it wrote.
func TextGatherer(write func(io.Writer) error) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		var buf bytes.Buffer
		if err := write(&buf); err != nil {
			return nil, fmt.Errorf("promidem: writing text metrics: %w", err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		byName, err := p.TextToMetricFamilies(&buf)
		if err != nil {
			return nil, fmt.Errorf("promidem: parsing text metrics: %w", err)
		}
		out := make([]*dto.MetricFamily, 0, len(byName))
		for _, mf := range byName {
			out = append(out, mf)
		}
		slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
		return out, nil
	})
}
