package broker_test

import (
	"context"
	"testing"

	"github.com/idem-dev/idem/broker"
)

func TestValidTraceParent(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", true}, // future versions may append
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", false},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false},
		{"", false},
		{"garbage", false},
	} {
		if got := broker.ValidTraceParent(tc.s); got != tc.ok {
			t.Errorf("ValidTraceParent(%q) = %v, want %v", tc.s, got, tc.ok)
		}
	}
}

func TestTraceRoundTrip(t *testing.T) {
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	in := &broker.Message{ID: "a", Headers: map[string]string{broker.HeaderTraceParent: tp, broker.HeaderTraceState: "k=v"}}
	ctx := broker.ExtractTrace(context.Background(), in)
	tc, ok := broker.TraceFromContext(ctx)
	if !ok || tc.TraceID() != "4bf92f3577b34da6a3ce929d0e0e4736" || tc.TraceState != "k=v" {
		t.Fatalf("extracted %+v %v", tc, ok)
	}
	out := &broker.Message{ID: "b"}
	got := broker.InjectTrace(ctx, out)
	if got.Headers[broker.HeaderTraceParent] != tp || got.Headers[broker.HeaderTraceState] != "k=v" {
		t.Fatalf("injected headers %v", got.Headers)
	}
	if out.Headers != nil {
		t.Fatal("InjectTrace modified its argument")
	}
	// A message with its own traceparent keeps it.
	own := &broker.Message{Headers: map[string]string{broker.HeaderTraceParent: "00-11111111111111111111111111111111-2222222222222222-01"}}
	if broker.InjectTrace(ctx, own) != own {
		t.Fatal("InjectTrace replaced an existing traceparent")
	}
	if broker.InjectTrace(context.Background(), out) != out {
		t.Fatal("InjectTrace without a trace in ctx changed the message")
	}
}

// FuzzExtractTrace feeds arbitrary traceparent/tracestate headers (the
// only message headers the core decodes): an invalid traceparent is
// ignored, a valid one reaches the handler's context unchanged, and
// injecting it into a message without one round-trips.
func FuzzExtractTrace(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE")
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "")
	f.Add("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")
	f.Add("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "a=\x00b")
	f.Add("", "\xff\xfe")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		m := &broker.Message{Headers: map[string]string{broker.HeaderTraceParent: tp, broker.HeaderTraceState: ts}}
		got, ok := broker.TraceFromContext(broker.ExtractTrace(context.Background(), m))
		if ok != broker.ValidTraceParent(tp) {
			t.Fatalf("ExtractTrace(%q) took it: %v, valid: %v", tp, ok, !ok)
		}
		if !ok {
			return
		}
		if got.TraceParent != tp || got.TraceState != ts {
			t.Fatalf("extracted %+v from %q %q", got, tp, ts)
		}
		if id := got.TraceID(); len(id) != 32 {
			t.Fatalf("TraceID %q of a valid traceparent", id)
		}
		out := broker.InjectTrace(broker.ContextWithTrace(context.Background(), got), &broker.Message{})
		if out.Headers[broker.HeaderTraceParent] != tp || (ts != "" && out.Headers[broker.HeaderTraceState] != ts) {
			t.Fatalf("injected %v, want %q %q", out.Headers, tp, ts)
		}
	})
}
