package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Publisher publishes with acks=all and the idempotent producer, and with
// TransactionalID set, one transaction per Publish call.
type Publisher struct {
	cfg PublisherConfig
	cl  *kgo.Client

	txMu sync.Mutex // one transaction at a time

	mu     sync.RWMutex
	closed bool
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher connects a producer. It does not wait for the brokers to
// answer; the first Publish does.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	opts := append(slices.Clone(cfg.ClientOpts),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.WithLogger(slogLogger{cfg.Logger}),
		// acks=all is also franz-go's default with idempotence; set it
		// explicitly so ClientOpts cannot weaken it.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(idPartitioner()),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxMessageBytes)),
	)
	if cfg.TransactionalID != "" {
		opts = append(opts, kgo.TransactionalID(cfg.TransactionalID))
	}
	if cfg.CancelInFlight {
		opts = append(opts, kgo.AllowIdempotentProduceCancellation())
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafkabroker: %w", idem.ErrInvalidArgument, err)
	}
	return &Publisher{cfg: cfg, cl: cl}, nil
}

// Publish sends msgs and returns once every record is acknowledged by all
// in-sync replicas. Every message needs an ID (fixed by the producer, so a
// retried Publish carries the same ID). With a transactional producer all of
// msgs commit or abort together.
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return broker.ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r, err := p.toRecord(m)
		if err != nil {
			return err
		}
		recs[i] = r
	}
	if p.cfg.TransactionalID != "" {
		return p.publishTx(ctx, recs)
	}
	return produceErr(ctx, resultsErr(p.cl.ProduceSync(ctx, recs...)))
}

// resultsErr aggregates the failures of one ProduceSync: how many records
// failed and each distinct error once.
func resultsErr(rs kgo.ProduceResults) error {
	failed := 0
	var errs []error
	seen := map[string]bool{}
	for _, r := range rs {
		if r.Err == nil {
			continue
		}
		failed++
		if !seen[r.Err.Error()] {
			seen[r.Err.Error()] = true
			errs = append(errs, r.Err)
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d records not acknowledged: %w", failed, len(rs), errors.Join(errs...))
}

func (p *Publisher) publishTx(ctx context.Context, recs []*kgo.Record) error {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	if err := p.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("kafkabroker: begin transaction: %w", err)
	}
	perr := resultsErr(p.cl.ProduceSync(ctx, recs...))
	commit := kgo.TryCommit
	if perr != nil {
		commit = kgo.TryAbort
		// Records still buffered must go before the abort; the abort
		// must run even when ctx is what failed.
		ctx = context.WithoutCancel(ctx)
		if err := p.cl.AbortBufferedRecords(ctx); err != nil {
			perr = errors.Join(perr, err)
		}
	}
	if err := p.cl.EndTransaction(ctx, commit); err != nil {
		return fmt.Errorf("kafkabroker: end transaction: %w", errors.Join(perr, err))
	}
	return produceErr(ctx, perr)
}

// produceErr maps a produce failure. A broker's error answer (a kerr code
// such as MESSAGE_TOO_LARGE) means the batch was refused; a timeout, a
// cancelled context or a lost connection means the records may or may not
// have been written: idem.ErrUnknownOutcome (publish again with the same
// ids; consumers dedup). MESSAGE_TOO_LARGE also wraps broker.ErrRejected:
// the record itself is refused, and would be again.
func produceErr(ctx context.Context, err error) error {
	var ke *kerr.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kgo.ErrClientClosed):
		return broker.ErrClosed
	case errors.Is(err, kerr.MessageTooLarge):
		// Larger than MaxMessageBytes or the topic's max.message.bytes:
		// the same record is refused again.
		return fmt.Errorf("%w: kafkabroker: publish: %w", broker.ErrRejected, err)
	case errors.As(err, &ke) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled):
		return fmt.Errorf("kafkabroker: publish: %w", err)
	case ctx.Err() != nil:
		return fmt.Errorf("%w: kafkabroker: publish: %w", idem.ErrUnknownOutcome, ctx.Err())
	}
	return fmt.Errorf("%w: kafkabroker: publish: %w", idem.ErrUnknownOutcome, err)
}

func (p *Publisher) toRecord(m *broker.Message) (*kgo.Record, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: kafkabroker: nil message: %w", idem.ErrInvalidArgument, broker.ErrRejected)
	}
	if m.ID == "" {
		return nil, fmt.Errorf("%w: kafkabroker: message without ID (fix it before the first send): %w", idem.ErrInvalidArgument, broker.ErrRejected)
	}
	topic := m.Topic
	if topic == "" {
		topic = p.cfg.Topic
	}
	if topic == "" {
		return nil, fmt.Errorf("%w: kafkabroker: message %s has no topic: %w", idem.ErrInvalidArgument, m.ID, broker.ErrRejected)
	}
	r := &kgo.Record{Topic: topic, Key: m.Key, Value: m.Payload}
	if !m.PublishedAt.IsZero() {
		r.Timestamp = m.PublishedAt
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+1)
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: broker.HeaderMessageID, Value: []byte(m.ID)})
	// Sorted so the same message always makes the same bytes.
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		if k != broker.HeaderMessageID {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(m.Headers[k])})
	}
	return r, nil
}

// Close flushes nothing (Publish is synchronous) and closes the client.
// Further Publish calls return broker.ErrClosed.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.cl.Close()
	return nil
}

// idPartitioner hashes the record key as Kafka's Java client does (murmur2),
// and a keyless record by its message id, so every publish of one message id
// (a producer retry, a duplicate) lands in the same partition and so in one
// consumer, in order, instead of racing itself on two.
func idPartitioner() kgo.Partitioner {
	keyed := kgo.StickyKeyPartitioner(nil)
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		tp := keyed.ForTopic(topic)
		return func(r *kgo.Record, n int) int {
			if r.Key != nil {
				return tp.Partition(r, n)
			}
			tmp := kgo.Record{Key: messageID(r)}
			return tp.Partition(&tmp, n)
		}
	})
}

func messageID(r *kgo.Record) []byte {
	for _, h := range r.Headers {
		if h.Key == broker.HeaderMessageID {
			return h.Value
		}
	}
	return nil
}
