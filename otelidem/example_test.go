package otelidem_test

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/otelidem"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A producer's span continued by the consumer: the send span's context
// rides in the message headers, the consumer runtime's process, claim and
// settle spans join its trace.
func Example() {
	exp := tracetest.NewInMemoryExporter() // an OTLP exporter in production
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ot := otelidem.New(otelidem.Config{TracerProvider: tp})
	b, _ := membroker.New(membroker.Config{})

	ctx, span := tp.Tracer("checkout").Start(context.Background(), "checkout")
	_ = ot.Publisher(b.NewPublisher()).Publish(ctx, &broker.Message{ID: "order-42", Topic: "orders", Payload: []byte("pay 10")})
	span.End()

	store, _ := memstore.New(memstore.Config{SweepInterval: -1})
	defer store.Close()
	guard, _ := idem.NewGuard(store, idem.WithHooks(ot.GuardHooks()))
	defer guard.Close()
	done := make(chan struct{})
	c, _ := consumer.New(consumer.Config{Subscriber: b.NewSubscriber("orders", "billing"), Guard: guard,
		Handler: ot.Handler(func(ctx context.Context, m *broker.Message) ([]byte, error) {
			close(done)
			return nil, nil
		})})
	rctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = c.Run(rctx); close(ran) }()
	<-done
	stop()
	<-ran // Run returns once what it fetched is settled

	trace := span.SpanContext().TraceID()
	for _, s := range exp.GetSpans() {
		fmt.Println(s.Name, s.SpanContext.TraceID() == trace)
	}
	// Output:
	// send orders true
	// checkout true
	// idem.claim true
	// process orders true
	// idem.settle true
}
