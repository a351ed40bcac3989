package otelidem_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/otelidem"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newProvider() (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), exp
}

// chain is one broker under test: where the producer publishes, where the
// consumer fetches, and how the test reads what the handler published.
type chain struct {
	pub        broker.Publisher // the producer's and the handler's
	sub        broker.Subscriber
	topic      string
	next       string                             // the topic the handler publishes to
	downstream func(t *testing.T) *broker.Message // the message the handler published
}

func byName(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	got := byName(spans, name)
	if len(got) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name)
		}
		t.Fatalf("%d spans named %q, want 1 (spans: %v)", len(got), name, names)
	}
	return got[0]
}

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

func wantParent(t *testing.T, child, parent tracetest.SpanStub) {
	t.Helper()
	if child.Parent.TraceID() != parent.SpanContext.TraceID() || child.Parent.SpanID() != parent.SpanContext.SpanID() {
		t.Errorf("span %q: parent %s/%s, want %q %s/%s", child.Name, child.Parent.TraceID(), child.Parent.SpanID(),
			parent.Name, parent.SpanContext.TraceID(), parent.SpanContext.SpanID())
	}
}

// runChain publishes one message inside a producer span, consumes it with
// the consumer runtime (guard hooks and handler wrapped by otelidem), and
// checks the trace: the consumer's process span is the child of the
// producer's span (of its send span when the producer publishes through
// otelidem.Publisher), claim and settle spans belong to the same trace,
// and the message the handler publishes carries the process span.
func runChain(t *testing.T, c chain, wrapPublisher bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp, exp := newProvider()
	ot := otelidem.New(otelidem.Config{TracerProvider: tp})

	pctx, prod := tp.Tracer("producer").Start(ctx, "producer")
	m := &broker.Message{ID: "order-1", Topic: c.topic, Payload: []byte("pay 10")}
	var err error
	if wrapPublisher {
		err = ot.Publisher(c.pub).Publish(pctx, m)
	} else {
		err = c.pub.Publish(otelidem.ContextWithBrokerTrace(pctx), m)
	}
	if err != nil {
		t.Fatal(err)
	}
	prod.End()

	st, err := memstore.New(memstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g, err := idem.NewGuard(st, idem.WithHooks(ot.GuardHooks()), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	handled := make(chan struct{}, 1)
	cons, err := consumer.New(consumer.Config{
		Subscriber: c.sub, Guard: g, Logger: quiet,
		Handler: ot.Handler(func(ctx context.Context, m *broker.Message) ([]byte, error) {
			// A plain publisher continues the process span (broker.InjectTrace).
			err := c.pub.Publish(ctx, &broker.Message{ID: m.ID + "-paid", Topic: c.next})
			handled <- struct{}{}
			return nil, err
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = cons.Run(rctx) }()
	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("the message was not handled")
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(byName(exp.GetSpans(), otelidem.SpanSettle)) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	wg.Wait()

	spans := exp.GetSpans()
	producer := one(t, spans, "producer")
	process := one(t, spans, "process "+c.topic)
	claim := one(t, spans, otelidem.SpanClaim)
	settle := one(t, spans, otelidem.SpanSettle)
	parent := producer
	if wrapPublisher {
		send := one(t, spans, "send "+c.topic)
		wantParent(t, send, producer)
		if send.SpanKind != trace.SpanKindProducer {
			t.Errorf("send span kind %v", send.SpanKind)
		}
		parent = send
	}
	wantParent(t, process, parent)
	wantParent(t, claim, parent)
	wantParent(t, settle, parent)
	if process.SpanKind != trace.SpanKindConsumer || attr(process, "messaging.message.id") != "order-1" {
		t.Errorf("process span: kind %v, attributes %v", process.SpanKind, process.Attributes)
	}
	if attr(claim, "idem.outcome") != "acquired" || attr(settle, "idem.action") != "complete" || attr(settle, "idem.settle.result") != "ok" {
		t.Errorf("claim %v, settle %v", claim.Attributes, settle.Attributes)
	}
	if attr(claim, "idem.key") != "" {
		t.Error("key recorded although Config.RecordKeys is off")
	}
	if !claim.StartTime.Before(process.StartTime) || process.EndTime.After(settle.EndTime) {
		t.Errorf("claim %v-%v, process %v-%v, settle %v-%v: not claim, process, settle in order",
			claim.StartTime, claim.EndTime, process.StartTime, process.EndTime, settle.StartTime, settle.EndTime)
	}
	next := c.downstream(t)
	sc := otelidem.SpanContextFromBroker(broker.TraceContext{TraceParent: next.Headers[broker.HeaderTraceParent]})
	if sc.TraceID() != process.SpanContext.TraceID() || sc.SpanID() != process.SpanContext.SpanID() {
		t.Errorf("downstream message's traceparent %q is not the process span %s", next.Headers[broker.HeaderTraceParent], process.SpanContext.SpanID())
	}
}

// TestTraceThroughMembroker: producer span -> (send span) -> message
// headers -> consumer runtime -> process, claim and settle spans ->
// downstream message, on the in-process broker.
func TestTraceThroughMembroker(t *testing.T) {
	for _, wrap := range []bool{false, true} {
		name := "ContextWithBrokerTrace"
		if wrap {
			name = "Publisher"
		}
		t.Run(name, func(t *testing.T) {
			b, err := membroker.New(membroker.Config{})
			if err != nil {
				t.Fatal(err)
			}
			runChain(t, chain{
				pub: b.NewPublisher(), sub: b.NewSubscriber("orders", "billing"), topic: "orders", next: "payments",
				downstream: func(t *testing.T) *broker.Message {
					got := b.Published("payments")
					if len(got) != 1 {
						t.Fatalf("%d downstream messages", len(got))
					}
					return got[0]
				},
			}, wrap)
		})
	}
}
