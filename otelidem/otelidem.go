package otelidem

import (
	"context"
	"maps"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the spans this package makes.
const ScopeName = "github.com/idem-dev/idem/otelidem"

// Span names.
const (
	SpanClaim     = "idem.claim"
	SpanSettle    = "idem.settle"
	SpanFailOpen  = "idem.fail_open"
	SpanLeaseLost = "idem.lease_lost"
	SpanUnrecord  = "idem.unrecorded"
)

// Attribute keys: OpenTelemetry's messaging conventions where one fits,
// idem.* for the rest.
const (
	AttrMessagingSystem  = attribute.Key("messaging.system")
	AttrDestination      = attribute.Key("messaging.destination.name")
	AttrMessageID        = attribute.Key("messaging.message.id")
	AttrOperationType    = attribute.Key("messaging.operation.type")
	AttrOperationName    = attribute.Key("messaging.operation.name")
	AttrBatchCount       = attribute.Key("messaging.batch.message_count")
	AttrKey              = attribute.Key("idem.key")
	AttrOutcome          = attribute.Key("idem.outcome")
	AttrAttempts         = attribute.Key("idem.attempts")
	AttrToken            = attribute.Key("idem.token")
	AttrAction           = attribute.Key("idem.action")
	AttrSettleResult     = attribute.Key("idem.settle.result")
	AttrUnrecordedPhase  = attribute.Key("idem.unrecorded.phase")
	AttrDelivery         = attribute.Key("idem.delivery")
	AttrTxStatus         = attribute.Key("idem.tx.status")
	maxKeyAttributeBytes = 256
)

// Config configures a Tracer. Zero values take the documented defaults.
type Config struct {
	// TracerProvider makes the spans (default otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// Propagator writes and reads message headers in Publisher, Inject
	// and Extract (default propagation.TraceContext{}, the W3C traceparent
	// and tracestate headers that broker.InjectTrace and
	// broker.ExtractTrace also use). A composite with propagation.Baggage{}
	// carries baggage too.
	Propagator propagation.TextMapPropagator
	// RecordKeys sets the idempotency key as the attribute idem.key
	// (truncated to 256 bytes). Off by default: keys can carry personal
	// data (an e-mail address, an account number). Error messages are
	// recorded as they are; the guard's quote keys, truncated.
	RecordKeys bool
	// MessagingSystem, when set, is the messaging.system attribute of
	// publish and process spans ("nats", "kafka", "rabbitmq", ...).
	MessagingSystem string
}

// Tracer makes idem's spans: claim and settle spans from the guard's hooks
// (GuardHooks), a process span around each consumer handler (Handler and
// its batch and transactional forms), a send span around each publish
// (Publisher), with the W3C trace context carried in message headers from
// producer to consumer. It is safe for concurrent use.
type Tracer struct {
	cfg    Config
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns a Tracer.
func New(cfg Config) *Tracer {
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	return &Tracer{cfg: cfg, tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator}
}

// w3c bridges OpenTelemetry and package broker, whose trace context is
// always W3C whatever Config.Propagator is.
var w3c = propagation.TraceContext{}

// Inject returns m with the trace context of ctx's span in its headers
// (through Config.Propagator), unless m already has a traceparent header;
// m is not modified (its headers are copied when some are added). Use it,
// or Publisher, where a publisher should continue the caller's span.
func (t *Tracer) Inject(ctx context.Context, m *broker.Message) *broker.Message {
	if m.Headers[broker.HeaderTraceParent] != "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return m
	}
	h := make(propagation.MapCarrier, len(m.Headers)+2)
	maps.Copy(h, m.Headers)
	t.prop.Inject(ctx, h)
	if len(h) == len(m.Headers) {
		return m
	}
	c := *m
	c.Headers = h
	return &c
}

// Extract returns ctx with the remote span context that m's headers carry
// (through Config.Propagator), or ctx itself when they carry none that is
// valid. A traceparent header that broker.ValidTraceParent rejects is
// ignored, as broker.ExtractTrace ignores it, so that the consumer's spans
// and the guard's agree: OpenTelemetry's W3C propagator also accepts a
// version-00 header with a trailing "-", which the specification does not.
func (t *Tracer) Extract(ctx context.Context, m *broker.Message) context.Context {
	h := m.Headers
	if tp, ok := h[broker.HeaderTraceParent]; ok && !broker.ValidTraceParent(tp) {
		h = maps.Clone(h)
		delete(h, broker.HeaderTraceParent)
		delete(h, broker.HeaderTraceState)
	}
	return t.prop.Extract(ctx, propagation.MapCarrier(h))
}

// ContextWithBrokerTrace returns ctx carrying its OpenTelemetry span
// context also as a broker.TraceContext, so that any broker publisher
// (which calls broker.InjectTrace) stamps it on the messages it sends.
// ctx is returned unchanged when it has no valid span context.
func ContextWithBrokerTrace(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return broker.ContextWithTrace(ctx, broker.TraceContext{TraceParent: c[broker.HeaderTraceParent], TraceState: c[broker.HeaderTraceState]})
}

// SpanContextFromBroker returns the OpenTelemetry span context of a
// broker.TraceContext (not valid when its traceparent is not).
func SpanContextFromBroker(tc broker.TraceContext) trace.SpanContext {
	c := propagation.MapCarrier{broker.HeaderTraceParent: tc.TraceParent}
	if tc.TraceState != "" {
		c[broker.HeaderTraceState] = tc.TraceState
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), c))
}

// parent is the context a guard hook's span starts from: ctx's span when
// it has one, else the trace context of the message being handled (the
// consumer runtime puts it in ctx as a broker.TraceContext), else none.
func parent(ctx context.Context) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	if tc, ok := broker.TraceFromContext(ctx); ok {
		if sc := SpanContextFromBroker(tc); sc.IsValid() {
			return trace.ContextWithRemoteSpanContext(ctx, sc)
		}
	}
	return ctx
}

func (t *Tracer) keyAttr(key []byte) attribute.KeyValue {
	if len(key) > maxKeyAttributeBytes {
		key = key[:maxKeyAttributeBytes]
	}
	return AttrKey.String(string(key))
}

func fail(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// GuardHooks returns the hooks to pass to idem.WithHooks. Each claim and
// each settle (a store call: retries are spans of their own) becomes a
// span from when the store was called to its answer, a child of ctx's span
// or, in the consumer runtime, of the producer's span the message carries.
// Fail-open passes, lost leases and unrecorded completions become
// zero-length spans (idem.fail_open, idem.lease_lost, idem.unrecorded)
// with the error.
func (t *Tracer) GuardHooks() idem.Hooks {
	return idem.Hooks{
		OnClaim: func(ctx context.Context, e idem.ClaimEvent) {
			end := time.Now()
			_, span := t.tracer.Start(parent(ctx), SpanClaim, trace.WithTimestamp(end.Add(-e.Duration)))
			if span.IsRecording() {
				if t.cfg.RecordKeys {
					span.SetAttributes(t.keyAttr(e.Key))
				}
				if e.Err != nil {
					fail(span, e.Err)
				} else {
					span.SetAttributes(AttrOutcome.String(e.Outcome.String()), AttrAttempts.Int(e.Attempts))
				}
			}
			span.End(trace.WithTimestamp(end))
		},
		OnSettle: func(ctx context.Context, e idem.SettleEvent) {
			end := time.Now()
			_, span := t.tracer.Start(parent(ctx), SpanSettle, trace.WithTimestamp(end.Add(-e.Duration)))
			if span.IsRecording() {
				span.SetAttributes(AttrAction.String(e.Action.String()), AttrToken.Int64(int64(e.Token)))
				if t.cfg.RecordKeys {
					span.SetAttributes(t.keyAttr(e.Key))
				}
				if e.Err != nil {
					span.SetAttributes(AttrSettleResult.String(settleResult(e.Err)))
					fail(span, e.Err)
				} else {
					span.SetAttributes(AttrSettleResult.String("ok"))
				}
			}
			span.End(trace.WithTimestamp(end))
		},
		OnFailOpen: func(ctx context.Context, key []byte, err error) {
			t.instant(ctx, SpanFailOpen, key, err)
		},
		OnLeaseLost: func(ctx context.Context, key []byte, token uint64, err error) {
			t.instant(ctx, SpanLeaseLost, key, err, AttrToken.Int64(int64(token)))
		},
		OnUnrecorded: func(ctx context.Context, e idem.UnrecordedEvent) {
			t.instant(ctx, SpanUnrecord, e.Key, e.Err, AttrToken.Int64(int64(e.Token)),
				AttrAction.String(e.Action.String()), AttrUnrecordedPhase.String(e.Phase.String()))
		},
	}
}

func settleResult(err error) string {
	switch {
	case errorIs(err, idem.ErrFenced):
		return "fenced"
	case errorIs(err, idem.ErrNotFound):
		return "not_found"
	}
	return "error"
}

// instant records a zero-length span for an event of the guard.
func (t *Tracer) instant(ctx context.Context, name string, key []byte, err error, attrs ...attribute.KeyValue) {
	_, span := t.tracer.Start(parent(ctx), name)
	if span.IsRecording() {
		span.SetAttributes(attrs...)
		if t.cfg.RecordKeys {
			span.SetAttributes(t.keyAttr(key))
		}
		if err != nil {
			fail(span, err)
		}
	}
	span.End()
}
