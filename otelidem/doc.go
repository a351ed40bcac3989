// Package otelidem traces idem with OpenTelemetry
// (go.opentelemetry.io/otel).
//
// A Tracer makes spans from the guard's hooks (idem.claim and idem.settle
// for each store call, with its outcome; idem.fail_open, idem.lease_lost
// and idem.unrecorded for those events), wraps consumer handlers in a
// consumer span "process <topic>", and wraps publishers in a producer span
// "send <topic>". The W3C trace context (traceparent, tracestate) travels
// in message headers, the same headers broker.InjectTrace and
// broker.ExtractTrace use, so producer and consumer join one trace:
//
//	ot := otelidem.New(otelidem.Config{})           // the global TracerProvider
//	pub := ot.Publisher(natsPublisher)              // producer: a send span, its context in the headers
//	guard, _ := idem.NewGuard(store, idem.WithHooks(ot.GuardHooks()))
//	c, _ := consumer.New(consumer.Config{..., Guard: guard,
//		Handler: ot.Handler(handle)})               // consumer: process span, child of the send span
//
// A producer that keeps its own publisher calls ContextWithBrokerTrace on
// the context it publishes with: broker publishers then stamp its span on
// the messages. Inside a wrapped handler the context carries the process
// span both ways, so messages the handler publishes continue the trace.
//
// Claim and settle spans of the consumer runtime are children of the
// producer's span (siblings of the process span): the runtime claims
// before the handler runs and settles after. Keys are not recorded unless
// Config.RecordKeys. See docs/observability.md.
package otelidem
