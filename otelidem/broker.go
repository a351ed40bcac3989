package otelidem

import (
	"context"
	"errors"
	"strconv"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

var errorIs = errors.Is

// topicOf is the destination of msgs when they share one, else "".
func topicOf[T any](items []T, topic func(T) string) string {
	if len(items) == 0 {
		return ""
	}
	first := topic(items[0])
	for _, it := range items[1:] {
		if topic(it) != first {
			return ""
		}
	}
	return first
}

func spanName(op, topic string) string {
	if topic == "" {
		return op
	}
	return op + " " + topic
}

func (t *Tracer) messagingAttrs(op, topic string, msgs []*broker.Message) []attribute.KeyValue {
	attrs := []attribute.KeyValue{AttrOperationType.String(op), AttrOperationName.String(op)}
	if t.cfg.MessagingSystem != "" {
		attrs = append(attrs, AttrMessagingSystem.String(t.cfg.MessagingSystem))
	}
	if topic != "" {
		attrs = append(attrs, AttrDestination.String(topic))
	}
	if len(msgs) == 1 {
		attrs = append(attrs, AttrMessageID.String(msgs[0].ID))
		if msgs[0].Delivery > 0 {
			attrs = append(attrs, AttrDelivery.Int(msgs[0].Delivery))
		}
	} else {
		attrs = append(attrs, AttrBatchCount.Int(len(msgs)))
	}
	return attrs
}

// Publisher wraps p: each Publish call is a producer span "send <topic>"
// (a child of ctx's span), and every message without a traceparent header
// carries that span's context, so the consumer's process span is its
// child.
func (t *Tracer) Publisher(p broker.Publisher) broker.Publisher { return &publisher{t: t, p: p} }

type publisher struct {
	t *Tracer
	p broker.Publisher
}

func (p *publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	topic := topicOf(msgs, func(m *broker.Message) string { return m.Topic })
	ctx, span := p.t.tracer.Start(ctx, spanName("send", topic), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(p.t.messagingAttrs("send", topic, msgs)...))
	defer span.End()
	out := make([]*broker.Message, len(msgs))
	for i, m := range msgs {
		out[i] = p.t.Inject(ctx, m)
	}
	err := p.p.Publish(ctx, out...)
	if err != nil {
		fail(span, err)
	}
	return err
}

func (p *publisher) Close() error { return p.p.Close() }

// startProcess starts the consumer span of msgs: the child of the
// producer's span when one message carries it, with links to the
// producers' spans for a batch. The returned context carries the span
// also as a broker.TraceContext, so messages the handler publishes
// continue it.
func (t *Tracer) startProcess(ctx context.Context, msgs []*broker.Message) (context.Context, trace.Span) {
	topic := topicOf(msgs, func(m *broker.Message) string { return m.Topic })
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(t.messagingAttrs("process", topic, msgs)...)}
	if len(msgs) == 1 {
		ctx = t.Extract(ctx, msgs[0])
	} else {
		links := make([]trace.Link, 0, len(msgs))
		for _, m := range msgs {
			if sc := trace.SpanContextFromContext(t.Extract(context.Background(), m)); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{AttrMessageID.String(m.ID)}})
			}
		}
		opts = append(opts, trace.WithLinks(links...))
	}
	ctx, span := t.tracer.Start(ctx, spanName("process", topic), opts...)
	return ContextWithBrokerTrace(ctx), span
}

// Handler wraps a consumer handler in a consumer span "process <topic>",
// the child of the span whose context the message carries. The handler's
// error, if any, is recorded on it.
func (t *Tracer) Handler(h consumer.Handler) consumer.Handler {
	return func(ctx context.Context, m *broker.Message) ([]byte, error) {
		ctx, span := t.startProcess(ctx, []*broker.Message{m})
		defer span.End()
		v, err := h(ctx, m)
		if err != nil {
			fail(span, err)
		}
		return v, err
	}
}

// BatchHandler wraps a batch handler in one consumer span linked to the
// span each message carries (a batch has many parents). A PartialError
// is recorded with the number of messages that failed.
func (t *Tracer) BatchHandler(h consumer.BatchHandler) consumer.BatchHandler {
	return func(ctx context.Context, msgs []*broker.Message) error {
		ctx, span := t.startProcess(ctx, msgs)
		defer span.End()
		err := h(ctx, msgs)
		if err != nil {
			fail(span, err)
		}
		return err
	}
}

// TxHandler wraps a transactional handler like Handler; the outcome's
// status is the attribute idem.tx.status.
func (t *Tracer) TxHandler(h consumer.TxHandler) consumer.TxHandler {
	return func(ctx context.Context, item consumer.TxItem) (consumer.TxOutcome, error) {
		ctx, span := t.startProcess(ctx, []*broker.Message{item.Msg})
		defer span.End()
		if t.cfg.RecordKeys {
			span.SetAttributes(t.keyAttr(item.Key))
		}
		o, err := h(ctx, item)
		span.SetAttributes(AttrTxStatus.String(txStatus(o.Status)))
		switch {
		case err != nil:
			fail(span, err)
		case o.Err != nil:
			fail(span, o.Err)
		}
		return o, err
	}
}

// TxBatchHandler wraps a transactional batch handler like BatchHandler.
func (t *Tracer) TxBatchHandler(h consumer.TxBatchHandler) consumer.TxBatchHandler {
	return func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		msgs := make([]*broker.Message, len(items))
		for i := range items {
			msgs[i] = items[i].Msg
		}
		ctx, span := t.startProcess(ctx, msgs)
		defer span.End()
		out, err := h(ctx, items)
		if err != nil {
			fail(span, err)
		}
		return out, err
	}
}

func txStatus(s consumer.TxStatus) string {
	switch s {
	case consumer.TxDone:
		return "done"
	case consumer.TxDuplicate:
		return "duplicate"
	case consumer.TxInProgress:
		return "in_progress"
	case consumer.TxRejected:
		return "rejected"
	case consumer.TxRetry:
		return "retry"
	}
	return strconv.Itoa(int(s))
}
