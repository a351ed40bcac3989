package promidem_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus"
)

// TestTextGatherer: metrics written in the text format are served beside
// a registry's (the way idem serve adds httpapi's counters to promidem's),
// and a writer's failure is the gather's error.
func TestTextGatherer(t *testing.T) {
	col, reg := newCollector(t, promidem.Config{})
	col.WatchStore(&fakeStater{st: idem.Stats{Completed: 3}})
	text := func(w io.Writer) error {
		_, err := fmt.Fprint(w, "# HELP idem_http_claims_total Claims.\n# TYPE idem_http_claims_total counter\nidem_http_claims_total{outcome=\"acquired\"} 7\n")
		return err
	}
	g := prometheus.Gatherers{reg, promidem.TextGatherer(text)}
	want(t, scrape(t, g), map[string]float64{
		`idem_http_claims_total{outcome="acquired"}`: 7,
		`idem_records{state="completed"}`:            3,
	})
	bad := promidem.TextGatherer(func(io.Writer) error { return errors.New("boom") })
	if _, err := bad.Gather(); err == nil {
		t.Fatal("a failing writer gathered without error")
	}
}
