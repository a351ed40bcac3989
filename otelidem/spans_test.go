package otelidem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/otelidem"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TestGuardSpans: with the guard used directly, claim and settle spans
// are children of the caller's span; a replay is a claim span with outcome
// completed; a store outage is a claim span with error status; a fail-open
// pass is an idem.fail_open span; RecordKeys puts the key on them.
func TestGuardSpans(t *testing.T) {
	tp, exp := newProvider()
	ot := otelidem.New(otelidem.Config{TracerProvider: tp, RecordKeys: true})
	ms, err := memstore.New(memstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	fs := faultstore.New(ms)
	g, err := idem.NewGuard(fs, idem.WithHooks(ot.GuardHooks()), idem.WithFailOpen(true), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx, req := tp.Tracer("t").Start(context.Background(), "request")
	fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	for range 2 {
		if _, err := g.Do(ctx, []byte("k1"), fn); err != nil {
			t.Fatal(err)
		}
	}
	fs.SetDown(true)
	if r, err := g.Do(ctx, []byte("k2"), fn); err != nil || !r.FailedOpen {
		t.Fatalf("fail-open: %+v %v", r, err)
	}
	req.End()

	spans := exp.GetSpans()
	request := one(t, spans, "request")
	claims := byName(spans, otelidem.SpanClaim)
	if len(claims) != 3 {
		t.Fatalf("%d claim spans, want 3", len(claims))
	}
	for _, c := range claims {
		wantParent(t, c, request)
	}
	if attr(claims[0], "idem.outcome") != "acquired" || attr(claims[1], "idem.outcome") != "completed" {
		t.Errorf("outcomes %q %q", attr(claims[0], "idem.outcome"), attr(claims[1], "idem.outcome"))
	}
	if claims[2].Status.Code != codes.Error || len(claims[2].Events) == 0 {
		t.Errorf("claim on a store outage: status %v, events %v", claims[2].Status, claims[2].Events)
	}
	if attr(claims[0], "idem.key") != "k1" || attr(claims[2], "idem.key") != "k2" {
		t.Errorf("keys %q %q", attr(claims[0], "idem.key"), attr(claims[2], "idem.key"))
	}
	open := one(t, spans, otelidem.SpanFailOpen)
	wantParent(t, open, request)
	if open.Status.Code != codes.Error {
		t.Errorf("fail-open span status %v", open.Status)
	}
	settle := one(t, spans, otelidem.SpanSettle)
	wantParent(t, settle, request)
}

// TestHandlerErrorAndBatchLinks: a failing handler's process span has
// error status; a batch handler's span links to every message's producer
// span; a transactional handler's span carries its outcome.
func TestHandlerErrorAndBatchLinks(t *testing.T) {
	tp, exp := newProvider()
	ot := otelidem.New(otelidem.Config{TracerProvider: tp, MessagingSystem: "test"})
	var msgs []*broker.Message
	var producers []trace.SpanContext
	for _, id := range []string{"a", "b"} {
		ctx, span := tp.Tracer("t").Start(context.Background(), "producer "+id)
		msgs = append(msgs, ot.Inject(ctx, &broker.Message{ID: id, Topic: "orders"}))
		producers = append(producers, span.SpanContext())
		span.End()
	}
	boom := errors.New("boom")
	h := ot.Handler(func(context.Context, *broker.Message) ([]byte, error) { return nil, boom })
	if _, err := h(context.Background(), msgs[0]); err != boom {
		t.Fatal(err)
	}
	bh := ot.BatchHandler(func(context.Context, []*broker.Message) error { return nil })
	if err := bh(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	th := ot.TxHandler(func(context.Context, consumer.TxItem) (consumer.TxOutcome, error) {
		return consumer.TxOutcome{Status: consumer.TxDuplicate}, nil
	})
	if _, err := th(context.Background(), consumer.TxItem{Msg: msgs[1], Key: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	spans := byName(exp.GetSpans(), "process orders")
	if len(spans) != 3 {
		t.Fatalf("%d process spans, want 3", len(spans))
	}
	single, batch, tx := spans[0], spans[1], spans[2]
	if single.Status.Code != codes.Error || single.Parent.SpanID() != producers[0].SpanID() || attr(single, "messaging.system") != "test" {
		t.Errorf("failed handler span: status %v, parent %v, attributes %v", single.Status, single.Parent.SpanID(), single.Attributes)
	}
	if batch.Parent.IsValid() || len(batch.Links) != 2 || attr(batch, "messaging.batch.message_count") != "2" {
		t.Errorf("batch span: parent %v, %d links, attributes %v", batch.Parent, len(batch.Links), batch.Attributes)
	}
	for i, l := range batch.Links {
		if l.SpanContext.SpanID() != producers[i].SpanID() {
			t.Errorf("link %d to %v, want producer %v", i, l.SpanContext.SpanID(), producers[i].SpanID())
		}
	}
	if attr(tx, "idem.tx.status") != "duplicate" || tx.Parent.SpanID() != producers[1].SpanID() {
		t.Errorf("tx span: attributes %v, parent %v", tx.Attributes, tx.Parent.SpanID())
	}
}
