package main

import (
	"io"
	"net/http"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveMetrics is what `idem serve` answers at /metrics: the HTTP API's
// own counters (written by httpapi's WriteMetrics), the records of the
// served namespaces by state (promidem's idem_records, summed over the
// namespaces: /metrics needs no token, so no label names one; polled at
// most every 30s, a SQL store counts with a scan), and the Go runtime's and
// the process's metrics.
func serveMetrics(writeHTTP func(io.Writer) error, stores []idem.Store) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	col, err := promidem.New(promidem.Config{})
	if err != nil {
		return nil, err
	}
	for _, s := range stores {
		if st, ok := s.(idem.Stater); ok {
			col.WatchStore(st)
		}
	}
	if err := reg.Register(col); err != nil {
		return nil, err
	}
	g := prometheus.Gatherers{reg, promidem.TextGatherer(writeHTTP)}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}), nil
}
