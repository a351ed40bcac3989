package broker

import (
	"context"
	"maps"
	"strings"
)

// TraceContext is the W3C trace context a message carries
// (traceparent/tracestate headers). The core stays free of OpenTelemetry;
// an otel integration turns this into a span context.
type TraceContext struct {
	TraceParent string
	TraceState  string
}

// TraceID returns the 32-hex-digit trace id of a valid traceparent, else "".
func (t TraceContext) TraceID() string {
	if !ValidTraceParent(t.TraceParent) {
		return ""
	}
	return t.TraceParent[3:35]
}

type traceKey struct{}

// TraceFromContext returns the trace context in ctx (the consumer runtime
// puts the handled message's there).
func TraceFromContext(ctx context.Context) (TraceContext, bool) {
	t, ok := ctx.Value(traceKey{}).(TraceContext)
	return t, ok
}

// ContextWithTrace returns ctx carrying t.
func ContextWithTrace(ctx context.Context, t TraceContext) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// ExtractTrace returns ctx carrying m's trace context when m has a valid
// traceparent header (an invalid one is ignored, as the W3C spec requires).
func ExtractTrace(ctx context.Context, m *Message) context.Context {
	tp := m.Headers[HeaderTraceParent]
	if !ValidTraceParent(tp) {
		return ctx
	}
	return ContextWithTrace(ctx, TraceContext{TraceParent: tp, TraceState: m.Headers[HeaderTraceState]})
}

// InjectTrace returns m with ctx's trace context in its headers, unless m
// already has a traceparent; m itself is not modified (its Headers map is
// copied when headers are added). Publishers call it so a message sent
// while handling another continues its trace.
func InjectTrace(ctx context.Context, m *Message) *Message {
	t, ok := TraceFromContext(ctx)
	if !ok || !ValidTraceParent(t.TraceParent) || m.Headers[HeaderTraceParent] != "" {
		return m
	}
	c := *m
	c.Headers = maps.Clone(m.Headers)
	if c.Headers == nil {
		c.Headers = make(map[string]string, 2)
	}
	c.Headers[HeaderTraceParent] = t.TraceParent
	if t.TraceState != "" {
		c.Headers[HeaderTraceState] = t.TraceState
	}
	return &c
}

// ValidTraceParent checks "vv-<32 hex>-<16 hex>-ff" with non-zero ids and
// a version other than ff.
func ValidTraceParent(s string) bool {
	if len(s) < 55 || (len(s) > 55 && (s[55] != '-' || s[0:2] == "00")) {
		return false // version 00 is exactly 55 bytes; later ones may append
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if !isHex(s[0:2]) || s[0:2] == "ff" || !isHex(s[3:35]) || !isHex(s[36:52]) || !isHex(s[53:55]) {
		return false
	}
	return strings.Trim(s[3:35], "0") != "" && strings.Trim(s[36:52], "0") != ""
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
