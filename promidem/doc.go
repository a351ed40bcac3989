// Package promidem exports idem's metrics to Prometheus
// (github.com/prometheus/client_golang).
//
// A Collector turns the core's hooks into counters and histograms (the
// guard's idem.Hooks, the consumer runtime's consumer.Hooks, the outbox
// relay's outbox.Hooks) and polls what only a snapshot can tell at scrape
// time (records by state through idem.Stater, consumer in-flight and held
// deliveries through consumer.Stats, broker lag through
// broker.LagReporter). Register it with any prometheus.Registerer:
//
//	col, err := promidem.New(promidem.Config{Namespace: "orders"})
//	reg.MustRegister(col)
//	guard, err := idem.NewGuard(store, idem.WithHooks(col.GuardHooks()))
//	if st, ok := store.(idem.Stater); ok {
//		col.WatchStore(st)
//	}
//	c, err := consumer.New(consumer.Config{..., Guard: guard, Hooks: col.ConsumerHooks()})
//	col.WatchConsumer(c)
//
// Names follow Prometheus conventions (idem_ prefix, base units in the
// name, _total on counters); every label has a fixed small set of values,
// and no key, message id or error text is ever a label. The duplicate rate
// of seed 001 is
//
//	sum(rate(idem_claims_total{outcome="completed"}[5m]))
//	  / sum(rate(idem_claims_total{outcome!~"error|invalid"}[5m]))
//
// The metric reference, the shipped alert rules (deploy/prometheus) and
// the Grafana dashboard (deploy/grafana) are described in
// docs/observability.md.
package promidem
