package broker

import "context"

// LagReporter is an optional Subscriber capability: how far the
// subscription is behind its stream, for metrics and alerts.
//
// Lag counts the messages of the subscription (the durable consumer or
// consumer group, all its members together) that are not settled yet:
// published and not yet delivered, or delivered and neither acked nor
// terminated (a Kafka offset not yet committed). A message the broker
// stopped delivering after its delivery limit is not counted. The figure
// may be slightly stale or approximate; Lag may make a request to the
// broker, so callers poll it at a modest rate.
type LagReporter interface {
	Lag(ctx context.Context) (int64, error)
}
