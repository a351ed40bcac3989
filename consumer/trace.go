package consumer

import (
	"context"
	"strings"

	"github.com/idem-dev/idem/broker"
)

// TraceContext is the W3C trace context a message carried
// (traceparent/tracestate headers). The core stays free of OpenTelemetry;
// an otel integration turns this into a span context.
type TraceContext struct {
	TraceParent string
	TraceState  string
}

// TraceID returns the 32-hex-digit trace id of a valid traceparent, else "".
func (t TraceContext) TraceID() string {
	if !validTraceParent(t.TraceParent) {
		return ""
	}
	return t.TraceParent[3:35]
}

type traceKey struct{}

// TraceFromContext returns the trace context of the message being handled.
func TraceFromContext(ctx context.Context) (TraceContext, bool) {
	t, ok := ctx.Value(traceKey{}).(TraceContext)
	return t, ok
}

// ContextWithTrace returns ctx carrying t.
func ContextWithTrace(ctx context.Context, t TraceContext) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// extractTrace reads a valid traceparent (and its tracestate) from m.
// An invalid traceparent is ignored, as the W3C spec requires.
func extractTrace(ctx context.Context, m *broker.Message) context.Context {
	tp := m.Headers[broker.HeaderTraceParent]
	if !validTraceParent(tp) {
		return ctx
	}
	return ContextWithTrace(ctx, TraceContext{TraceParent: tp, TraceState: m.Headers[broker.HeaderTraceState]})
}

// validTraceParent checks "vv-<32 hex>-<16 hex>-ff" with non-zero ids and
// a version other than ff.
func validTraceParent(s string) bool {
	if len(s) < 55 || (len(s) > 55 && s[55] != '-') {
		return false
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
