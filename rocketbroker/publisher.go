package rocketbroker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/apache/rocketmq-client-go/v2"
	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// HeaderKey is the property that carries Message.Key, base64-encoded
// (properties are text). The key is also the message's SHARDING_KEY, which
// chooses its queue.
const HeaderKey = "idem-key"

// Publisher sends messages synchronously through the official client's
// producer: Publish returns nil only once the broker answered SEND_OK for
// every message.
type Publisher struct {
	cfg    PublisherConfig
	p      rocketmq.Producer
	closed atomic.Bool
}

var instanceSeq atomic.Int64

// instanceName is unique per client in this process: the library keeps
// one client per ip@instance, shared by every producer and consumer that
// names it, and a consumer group may be registered once per client; two
// subscribers of one group in one process need two.
func instanceName(kind string) string {
	return fmt.Sprintf("idem-%s-%d-%d", kind, os.Getpid(), instanceSeq.Add(1))
}

// queueSelector sends a message with a key to the queue its SHARDING_KEY
// hashes to (FNV-1a, as the client's hash selector: per-key order), and
// one without to the next queue in turn (as the client's default), so
// that one publisher's keyless messages reach each queue in publish
// order.
type queueSelector struct{ next atomic.Uint32 }

func (q *queueSelector) Select(m *primitive.Message, mqs []*primitive.MessageQueue, lastBroker string) *primitive.MessageQueue {
	if k := m.GetShardingKey(); k != "" {
		h := fnv.New32a()
		h.Write([]byte(k))
		return mqs[h.Sum32()%uint32(len(mqs))]
	}
	for range mqs {
		mq := mqs[q.next.Add(1)%uint32(len(mqs))]
		if mq.BrokerName != lastBroker || lastBroker == "" {
			return mq // a retry avoids the broker that just failed
		}
	}
	return mqs[q.next.Add(1)%uint32(len(mqs))]
}

func credentials(c Client) primitive.Credentials {
	return primitive.Credentials{AccessKey: c.AccessKey, SecretKey: c.SecretKey}
}

// NewPublisher checks cfg and starts a producer. It does not connect:
// the first Publish looks the topic's route up.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	installLog()
	opts := []producer.Option{
		producer.WithNameServer(cfg.NameServers),
		producer.WithGroupName(cfg.Group),
		producer.WithInstanceName(instanceName("producer")),
		producer.WithSendMsgTimeout(cfg.SendTimeout),
		producer.WithRetry(cfg.Retries),
		producer.WithQueueSelector(&queueSelector{}),
	}
	if cfg.AccessKey != "" {
		opts = append(opts, producer.WithCredentials(credentials(cfg.Client)))
	}
	p, err := rocketmq.NewProducer(opts...)
	if err != nil {
		return nil, fmt.Errorf("rocketbroker: new producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("rocketbroker: start producer: %w", err)
	}
	return &Publisher{cfg: cfg, p: p}, nil
}

// Publish sends msgs one at a time, in order, each with SendSync, and
// returns at the first failure (the messages before it are stored). A
// send is retried by the client (PublisherConfig.Retries) after a
// transport error or a retryable broker code; nil means SEND_OK for every
// message: any other status (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
// SLAVE_NOT_AVAILABLE: stored on the master, not flushed or replicated as
// the broker is configured to) is an error wrapping
// idem.ErrUnknownOutcome. Errors: idem.ErrInvalidArgument (no id, a
// header the properties cannot carry), idem.ErrUnavailable (no route to
// the topic, no broker answer before sending: not stored),
// idem.ErrUnknownOutcome (no answer after sending: publish the same ids
// again; consumers dedup by id), or the broker's refusal (not stored).
//
// Each message carries Message.ID as the property idem-message-id and as
// its KEYS (the broker's message key index), Message.Key base64 in
// idem-key and as its SHARDING_KEY, the headers as user properties and
// the publishing context's trace context (broker.InjectTrace) when it has
// none.
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	out := make([]*primitive.Message, len(msgs))
	for i, m := range msgs {
		rm, err := toRocket(ctx, m)
		if err != nil {
			// The message itself is invalid: refused again on every try.
			return fmt.Errorf("%w: %w", broker.ErrRejected, err)
		}
		out[i] = rm
	}
	for i, rm := range out {
		if p.closed.Load() {
			return broker.ErrClosed
		}
		res, err := p.p.SendSync(ctx, rm)
		if err != nil {
			return fmt.Errorf("rocketbroker: send %s (%d of %d): %w", msgs[i].ID, i+1, len(msgs), classifySend(err))
		}
		if res.Status != primitive.SendOK {
			return fmt.Errorf("%w: rocketbroker: send %s: status %s (stored on the master, not flushed or replicated)",
				idem.ErrUnknownOutcome, msgs[i].ID, sendStatus(res.Status))
		}
	}
	return nil
}

func sendStatus(s primitive.SendStatus) string {
	switch s {
	case primitive.SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case primitive.SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	case primitive.SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	case primitive.SendUnknownError:
		return "UNKNOWN_ERROR"
	}
	return strconv.Itoa(int(s))
}

// classifySend maps a send error onto idem's sentinels: nothing sent
// (no route, refused dial, a broker too busy to take it) is
// ErrUnavailable; a request that may have reached the broker without an
// answer (timeout, reset) is ErrUnknownOutcome; a broker's refusal of the
// message itself stays as it is.
func classifySend(err error) error {
	c := idem.ClassifyError(err)
	if errors.Is(c, idem.ErrUnavailable) || errors.Is(c, idem.ErrUnknownOutcome) {
		return c
	}
	msg := err.Error()
	switch {
	case errors.Is(err, rmqerrors.ErrRequestTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %w", idem.ErrUnknownOutcome, err)
	case strings.Contains(msg, "route info not found"), errors.Is(err, rmqerrors.ErrNotRunning):
		return fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
	case strings.HasPrefix(msg, "CODE: "):
		code, _, _ := strings.Cut(strings.TrimPrefix(msg, "CODE: "), ",")
		switch code {
		case "2", "14": // SYSTEM_BUSY, SERVICE_NOT_AVAILABLE: not taken
			return fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
		}
		return err
	}
	return fmt.Errorf("%w: %w", idem.ErrUnknownOutcome, err)
}

// systemProperties are the properties the broker and the clients own
// (MessageConst.STRING_HASH_SET and the Go client's additions): a header
// with one of these names is refused, and none is reported as a header.
var systemProperties = map[string]bool{
	"TRACE_ON": true, "MSG_REGION": true, "KEYS": true, "TAGS": true, "WAIT": true, "DELAY": true,
	"RETRY_TOPIC": true, "REAL_TOPIC": true, "REAL_QID": true, "TRAN_MSG": true, "PGROUP": true,
	"MIN_OFFSET": true, "MAX_OFFSET": true, "BUYER_ID": true, "ORIGIN_MESSAGE_ID": true,
	"TRANSFER_FLAG": true, "CORRECTION_FLAG": true, "MQ2_FLAG": true, "RECONSUME_TIME": true,
	"UNIQ_KEY": true, "MAX_RECONSUME_TIMES": true, "CONSUME_START_TIME": true, "INSTANCE_ID": true,
	"CORRELATION_ID": true, "REPLY_TO_CLIENT": true, "TTL": true, "ARRIVE_TIME": true,
	"PUSH_REPLY_TIME": true, "CLUSTER": true, "MSG_TYPE": true, "INNER_MULTI_QUEUE_OFFSET": true,
	"INNER_MULTI_DISPATCH": true, "SHARDING_KEY": true, "TRAN_PREPARED_QUEUE_OFFSET": true,
	"TRANSACTION_CHECK_TIMES": true, "CHECK_IMMUNITY_TIME_IN_SECONDS": true, "__transactionId__": true,
	"TIMER_DELIVER_MS": true, HeaderKey: true,
}

func validProperty(s string) bool { return !strings.ContainsAny(s, "\x01\x02") }

func toRocket(ctx context.Context, m *broker.Message) (*primitive.Message, error) {
	if m.ID == "" {
		return nil, fmt.Errorf("%w: rocketbroker: message without ID (ids are fixed by the producer)", idem.ErrInvalidArgument)
	}
	if m.Topic == "" {
		return nil, fmt.Errorf("%w: rocketbroker: message %s without Topic", idem.ErrInvalidArgument, m.ID)
	}
	if !validProperty(m.ID) || strings.ContainsRune(m.ID, ' ') {
		return nil, fmt.Errorf("%w: rocketbroker: message id %q: no spaces (KEYS separator) or \\x01 \\x02", idem.ErrInvalidArgument, m.ID)
	}
	m = broker.InjectTrace(ctx, m)
	rm := primitive.NewMessage(m.Topic, m.Payload)
	for k, v := range m.Headers {
		if k == "" || systemProperties[k] || !validProperty(k) || !validProperty(v) || v == "" {
			return nil, fmt.Errorf("%w: rocketbroker: message %s: header %q cannot be a user property (reserved, empty, or with \\x01 \\x02)",
				idem.ErrInvalidArgument, m.ID, k)
		}
		rm.WithProperty(k, v)
	}
	rm.WithProperty(broker.HeaderMessageID, m.ID)
	rm.WithKeys([]string{m.ID})
	if m.Key != nil {
		k := base64.StdEncoding.EncodeToString(m.Key)
		rm.WithProperty(HeaderKey, k)
		rm.WithShardingKey(k)
	}
	if n := len(rm.MarshallProperties()); n > 32767 {
		return nil, fmt.Errorf("%w: rocketbroker: message %s: properties of %d bytes over 32767", idem.ErrInvalidArgument, m.ID, n)
	}
	return rm, nil
}

// Close shuts the producer down. Publish calls under way may fail.
func (p *Publisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	return p.p.Shutdown()
}

var _ broker.Publisher = (*Publisher)(nil)
