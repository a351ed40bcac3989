package natsbroker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// HeaderKey carries Message.Key, base64-encoded (headers are text; keys are
// bytes). JetStream has no key field: ordering is per stream.
const HeaderKey = "idem-key"

// MinServerVersion is the oldest nats-server the Subscriber accepts: 2.9.0
// brought the consumer create API (consumer name and filter subject in the
// request subject) that nats.go's jetstream package uses. NewSubscriber
// refuses an older server with ErrServerVersion.
const MinServerVersion = "2.9.0"

// termReasonVersion is the first nats-server that honours a +TERM carrying
// a reason. Older servers ignore such a term altogether: the message comes
// back every AckWait until MaxDeliver.
const termReasonVersion = "2.10.4"

// ErrServerVersion: the connected server is older than MinServerVersion.
var ErrServerVersion = errors.New("natsbroker: nats-server older than " + MinServerVersion)

// serverVersion is a nats-server version's major, minor and patch.
type serverVersion [3]int

// parseVersion reads "2.10.4", "v2.10.4" or "2.11.0-RC.1" (pre-release
// and build suffixes are ignored).
func parseVersion(s string) (serverVersion, bool) {
	s = strings.TrimPrefix(s, "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return serverVersion{}, false
	}
	var v serverVersion
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return serverVersion{}, false
		}
		v[i] = n
	}
	return v, true
}

// atLeast reports whether version string have is min or newer; an unknown
// or unreadable version is not.
func atLeast(have, min string) bool {
	h, ok := parseVersion(have)
	m, _ := parseVersion(min)
	if !ok {
		return false
	}
	for i := range h {
		if h[i] != m[i] {
			return h[i] > m[i]
		}
	}
	return true
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// JS is the JetStream context to publish with (required). The caller
	// owns its connection.
	JS jetstream.JetStream
	// NoDedup stops setting Nats-Msg-Id, so the server's duplicate window
	// does not drop re-publishes. Off by default: server-side dedup is the
	// first line against producer retries (F6).
	NoDedup bool
	// Timeout bounds the wait for one batch's publish acks when ctx has no
	// deadline. Default 30s.
	Timeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports a bad configuration.
func (c PublisherConfig) Validate() error {
	if c.JS == nil {
		return errors.New("natsbroker: PublisherConfig.JS is required")
	}
	if c.Timeout < 0 {
		return errors.New("natsbroker: negative Timeout")
	}
	return nil
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Publisher publishes to JetStream and waits for every publish ack.
// Message.Topic is the subject. A message without a traceparent gets the
// trace context of ctx (broker.InjectTrace).
type Publisher struct {
	cfg    PublisherConfig
	closed atomic.Bool
}

// NewPublisher returns a Publisher.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg.withDefaults()}, nil
}

func (p *Publisher) toNats(ctx context.Context, m *broker.Message) (*nats.Msg, error) {
	if m.ID == "" {
		return nil, fmt.Errorf("natsbroker: message without ID (ids are fixed by the producer): %w", broker.ErrRejected)
	}
	if m.Topic == "" {
		return nil, fmt.Errorf("natsbroker: message %s without Topic: %w", m.ID, broker.ErrRejected)
	}
	m = broker.InjectTrace(ctx, m)
	nm := nats.NewMsg(m.Topic)
	nm.Data = m.Payload
	for k, v := range m.Headers {
		nm.Header.Set(k, v)
	}
	nm.Header.Set(broker.HeaderMessageID, m.ID)
	if m.Key != nil {
		nm.Header.Set(HeaderKey, base64.StdEncoding.EncodeToString(m.Key))
	}
	return nm, nil
}

func (p *Publisher) opts(m *broker.Message) []jetstream.PublishOpt {
	if p.cfg.NoDedup {
		return nil
	}
	return []jetstream.PublishOpt{jetstream.WithMsgID(m.ID)}
}

// Publish sends msgs asynchronously and returns once every one has a
// publish ack (stored by the stream), or the first error. A publish the
// server reports as a duplicate (same Nats-Msg-Id in the window) counts
// as success: the first copy is stored.
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	if len(msgs) == 1 {
		nm, err := p.toNats(ctx, msgs[0])
		if err != nil {
			return err
		}
		if _, err := p.cfg.JS.PublishMsg(ctx, nm, p.opts(msgs[0])...); err != nil {
			return p.pubErr("natsbroker: publish "+msgs[0].ID, err)
		}
		return nil
	}
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		nm, err := p.toNats(ctx, m)
		if err != nil {
			return err
		}
		f, err := p.cfg.JS.PublishMsgAsync(nm, p.opts(m)...)
		if err != nil {
			return p.pubErr("natsbroker: publish "+m.ID, err)
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return p.pubErr("natsbroker: publish "+msgs[i].ID, err)
		case <-ctx.Done():
			return fmt.Errorf("natsbroker: publish ack for %s: %w", msgs[i].ID, ctx.Err())
		}
	}
	return nil
}

// pubErr classifies a publish error, keeping the client's in the chain:
// a message the server or client refuses itself (larger than the server's
// max payload or the stream's MaxMsgSize) wraps broker.ErrRejected; a
// closed connection wraps idem.ErrUnavailable and nats.ErrConnectionClosed
// (the client's async publish reports it as text only).
func (p *Publisher) pubErr(what string, err error) error {
	var api *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload),
		errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return fmt.Errorf("%s: %w: %w", what, broker.ErrRejected, err)
	case errors.Is(err, nats.ErrConnectionClosed):
		return fmt.Errorf("%s: %w: %w", what, idem.ErrUnavailable, err)
	case connClosed(p.cfg.JS):
		return fmt.Errorf("%s: %w: %w (%w)", what, idem.ErrUnavailable, nats.ErrConnectionClosed, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// connClosed: js's connection is closed (false when it cannot tell, e.g.
// a test double without a connection).
func connClosed(js jetstream.JetStream) (closed bool) {
	defer func() {
		if recover() != nil {
			closed = false
		}
	}()
	c := js.Conn()
	return c != nil && c.IsClosed()
}

// Close stops the publisher; the connection stays open (the caller owns it).
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}

// SubscriberConfig configures a Subscriber: one durable pull consumer.
type SubscriberConfig struct {
	JS     jetstream.JetStream // required
	Stream string              // required
	// Durable is the consumer name, i.e. the consumer group (required).
	Durable string
	// FilterSubject limits the consumer to matching subjects (optional).
	FilterSubject string
	// AckWait: a delivery not acked (or kept alive with InProgress) within
	// it is redelivered. Default 30s.
	AckWait time.Duration
	// MaxDeliver bounds deliveries per message. Default 20; -1 unlimited
	// (then RedeliveryWindow is unbounded).
	MaxDeliver int
	// BackOff, if set, replaces AckWait for successive redeliveries after
	// an ack timeout (server-side).
	BackOff []time.Duration
	// MaxAckPending bounds unacked deliveries across the group. Default
	// 10000.
	MaxAckPending int
	// PollWait is the longest one pull request waits on the server.
	// Default 5s.
	PollWait time.Duration
	// NoTermReason makes Term send a plain +TERM even to servers that
	// accept a reason (2.10.4 and later); the reason is then only logged
	// here. Without it the reason goes to the server's MSG_TERMINATED
	// advisory where the connected server is new enough. Set it during a
	// rolling upgrade of a cluster from a server before 2.10.4: acks are
	// processed by the consumer's leader, which may still run the old
	// version (and ignore the term) while the connected server is new.
	NoTermReason bool
	// AckSync makes Ack wait for the server's confirmation (DoubleAck).
	// Off by default: a lost ack only causes a redelivery, which the guard
	// absorbs, and Close flushes pending acks.
	AckSync bool
	Logger  *slog.Logger
}

// Validate reports a bad configuration.
func (c SubscriberConfig) Validate() error {
	switch {
	case c.JS == nil:
		return errors.New("natsbroker: SubscriberConfig.JS is required")
	case c.Stream == "":
		return errors.New("natsbroker: SubscriberConfig.Stream is required")
	case c.Durable == "":
		return errors.New("natsbroker: SubscriberConfig.Durable is required")
	case c.AckWait < 0, c.PollWait < 0, c.MaxAckPending < 0:
		return errors.New("natsbroker: negative AckWait, PollWait or MaxAckPending")
	case c.MaxDeliver < -1:
		return errors.New("natsbroker: MaxDeliver must be -1 (unlimited) or >= 0")
	}
	for _, d := range c.BackOff {
		if d <= 0 {
			return errors.New("natsbroker: BackOff durations must be positive")
		}
	}
	return nil
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 20
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 10000
	}
	if c.PollWait == 0 {
		c.PollWait = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// RedeliveryWindow is the longest the server may keep redelivering a
// message: the ack wait (or back-off step) of every delivery up to
// MaxDeliver. Nak delays chosen by the consumer come on top.
func (c SubscriberConfig) RedeliveryWindow() time.Duration {
	c = c.withDefaults()
	if c.MaxDeliver < 0 {
		return time.Duration(math.MaxInt64)
	}
	if len(c.BackOff) == 0 {
		return c.AckWait * time.Duration(c.MaxDeliver)
	}
	var sum time.Duration
	for i := range c.MaxDeliver {
		sum += c.BackOff[min(i, len(c.BackOff)-1)]
	}
	return sum
}

// Subscriber fetches from a durable pull consumer with explicit acks.
type Subscriber struct {
	cfg      SubscriberConfig
	cc       jetstream.ConsumerConfig
	closeCtx context.Context
	close    context.CancelFunc
	once     sync.Once
	wg       sync.WaitGroup // the goroutine creating the durable consumer

	// ready is closed once the durable consumer exists (cons, maxDel
	// set) or can never be created (failed set); until then Fetch waits.
	ready   chan struct{}
	mu      sync.Mutex
	cons    jetstream.Consumer
	maxDel  int // the consumer's MaxDeliver as the server holds it
	failed  error
	lastErr error // the latest failure to create it
}

// Retry pauses while the durable consumer cannot be created.
const (
	createRetryMin = 100 * time.Millisecond
	createRetryMax = 5 * time.Second
)

// NewSubscriber creates (or updates) the durable consumer and returns a
// subscriber on it. Several subscribers with one Durable share its work.
//
// A server that cannot be reached, or a stream that does not exist yet, is
// not an error: NewSubscriber logs it and returns, and keeps creating the
// durable consumer in the background with backoff (100ms doubling to 5s)
// until it exists or the subscriber is closed; Fetch waits for it and
// WaitReady tells (broker.Readier). For an application that may start
// before its server, connect with nats.RetryOnFailedConnect(true) (and
// nats.MaxReconnects(-1)), or nats.Connect itself fails. Errors no retry
// can fix are returned at once: a server older than MinServerVersion
// (ErrServerVersion), a configuration the server refuses, a closed
// connection; found later, they end the retries and WaitReady and Fetch
// return them.
func NewSubscriber(ctx context.Context, cfg SubscriberConfig) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{cfg: cfg, closeCtx: cctx, close: cancel, ready: make(chan struct{}), maxDel: cfg.MaxDeliver}
	s.cc = jetstream.ConsumerConfig{
		Durable:       cfg.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		BackOff:       cfg.BackOff,
		MaxAckPending: cfg.MaxAckPending,
		FilterSubject: cfg.FilterSubject,
	}
	err := s.create(ctx)
	switch {
	case err == nil:
		return s, nil
	case permanent(err):
		cancel()
		return nil, err
	}
	s.retryLater(err)
	s.wg.Add(1)
	go s.createLoop()
	return s, nil
}

// errNotConnected: the connection is not up (yet).
var errNotConnected = errors.New("natsbroker: not connected to a server")

// create makes the durable consumer once.
func (s *Subscriber) create(ctx context.Context) error {
	nc := s.cfg.JS.Conn()
	if nc != nil {
		switch {
		case nc.IsClosed():
			return fmt.Errorf("natsbroker: consumer %s on stream %s: %w", s.cfg.Durable, s.cfg.Stream, nats.ErrConnectionClosed)
		case !nc.IsConnected():
			return errNotConnected
		}
		if v := nc.ConnectedServerVersion(); v != "" && !atLeast(v, MinServerVersion) {
			return fmt.Errorf("%w: connected to %s", ErrServerVersion, v)
		}
	}
	cons, err := s.cfg.JS.CreateOrUpdateConsumer(ctx, s.cfg.Stream, s.cc)
	if err != nil {
		return fmt.Errorf("natsbroker: consumer %s on stream %s: %w", s.cfg.Durable, s.cfg.Stream, err)
	}
	s.mu.Lock()
	s.cons = cons
	if info := cons.CachedInfo(); info != nil {
		s.maxDel = info.Config.MaxDeliver
	}
	s.mu.Unlock()
	close(s.ready)
	return nil
}

// permanent reports an error creating the durable consumer that no retry
// fixes: an old server, a closed connection, or the server's refusal of
// the configuration (a JetStream API error other than a stream not found
// or JetStream not available yet).
func permanent(err error) bool {
	if errors.Is(err, ErrServerVersion) || errors.Is(err, nats.ErrConnectionClosed) {
		return true
	}
	var ae *jetstream.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode {
	case jetstream.JSErrCodeStreamNotFound, jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
		return false
	}
	return ae.Code != 503 && ae.Code != 408 // unavailable, timeout: the server is not ready
}

// retryLater records err and logs that the durable consumer does not exist
// yet.
func (s *Subscriber) retryLater(err error) {
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	s.cfg.Logger.Warn("natsbroker: durable consumer not created yet; retrying in the background", "stream", s.cfg.Stream, "durable", s.cfg.Durable, "err", err)
}

// createLoop creates the durable consumer with backoff until it exists,
// an error no retry fixes, or Close.
func (s *Subscriber) createLoop() {
	defer s.wg.Done()
	delay := createRetryMin
	for attempt := 1; ; attempt++ {
		t := time.NewTimer(delay)
		select {
		case <-s.closeCtx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.closeCtx, max(s.cfg.PollWait, 5*time.Second))
		err := s.create(ctx)
		cancel()
		switch {
		case err == nil:
			s.cfg.Logger.Info("natsbroker: durable consumer created", "stream", s.cfg.Stream, "durable", s.cfg.Durable, "attempts", attempt+1)
			return
		case s.closeCtx.Err() != nil:
			return
		case permanent(err):
			s.cfg.Logger.Error("natsbroker: durable consumer cannot be created; giving up", "stream", s.cfg.Stream, "durable", s.cfg.Durable, "err", err)
			s.mu.Lock()
			s.failed = err
			s.mu.Unlock()
			close(s.ready)
			return
		}
		delay = min(2*delay, createRetryMax)
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		s.cfg.Logger.Warn("natsbroker: durable consumer not created yet; retrying", "stream", s.cfg.Stream, "durable", s.cfg.Durable, "attempt", attempt, "retry_in", delay, "err", err)
	}
}

// WaitReady implements broker.Readier: it returns nil once the durable
// consumer exists (at once if it does), and otherwise waits until it is
// created, ctx ends (ctx's error with the last error creating it), the
// subscriber is closed (broker.ErrClosed) or creating it failed for good
// (that error).
func (s *Subscriber) WaitReady(ctx context.Context) error {
	_, err := s.consumer(ctx)
	return err
}

// consumer returns the durable consumer, waiting for it as WaitReady does.
func (s *Subscriber) consumer(ctx context.Context) (jetstream.Consumer, error) {
	if s.closeCtx.Err() != nil {
		return nil, broker.ErrClosed
	}
	select {
	case <-s.ready:
	default:
		select {
		case <-s.ready:
		case <-s.closeCtx.Done():
			return nil, broker.ErrClosed
		case <-ctx.Done():
			s.mu.Lock()
			last := s.lastErr
			s.mu.Unlock()
			if last != nil {
				return nil, fmt.Errorf("natsbroker: consumer %s on stream %s not created yet: %w (last error: %w)", s.cfg.Durable, s.cfg.Stream, ctx.Err(), last)
			}
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return nil, s.failed
	}
	return s.cons, nil
}

// RedeliveryWindow implements broker.Subscriber.
func (s *Subscriber) RedeliveryWindow() time.Duration { return s.cfg.RedeliveryWindow() }

// MaxDeliveries is the consumer's MaxDeliver as the server holds it (0 for
// unlimited): JetStream stops delivering a message after that many
// deliveries, so the consumer runtime dead-letters a message on its last
// delivery instead of handing it back (broker.DeliveryLimiter).
func (s *Subscriber) MaxDeliveries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.maxDel, 0)
}

// Fetch returns what is available at once (up to max) or waits for the
// first message, polling the server at most PollWait per request.
func (s *Subscriber) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if max <= 0 {
		max = 1
	}
	cons, err := s.consumer(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	for {
		if s.closeCtx.Err() != nil {
			return nil, broker.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Fast path: whatever is pending now, in one round trip.
		out, err := s.collect(cons.FetchNoWait(max))
		if err != nil || len(out) > 0 {
			return out, err
		}
		// Wait for the first message; the server expires the request
		// before our context ends, so nothing is delivered to an inbox
		// nobody reads.
		wait := s.cfg.PollWait
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if wait < 20*time.Millisecond {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		pctx, cancel := context.WithTimeout(ctx, wait)
		stop := context.AfterFunc(s.closeCtx, cancel)
		out, err = s.collect(cons.Fetch(1, jetstream.FetchContext(pctx)))
		stop()
		cancel()
		if len(out) > 0 {
			if max > 1 {
				more, _ := s.collect(cons.FetchNoWait(max - 1))
				out = append(out, more...)
			}
			return out, nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
}

func (s *Subscriber) collect(b jetstream.MessageBatch, err error) ([]*broker.Message, error) {
	if err != nil {
		return nil, s.mapErr(err)
	}
	var out []*broker.Message
	for jm := range b.Messages() {
		out = append(out, s.convert(jm))
	}
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
		return out, s.mapErr(err)
	}
	return out, nil
}

func (s *Subscriber) mapErr(err error) error {
	if s.closeCtx.Err() != nil {
		return broker.ErrClosed
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("natsbroker: fetch from %s/%s: %w", s.cfg.Stream, s.cfg.Durable, err)
}

func (s *Subscriber) convert(jm jetstream.Msg) *broker.Message {
	h := jm.Headers()
	m := &broker.Message{
		Topic:    jm.Subject(),
		Payload:  jm.Data(),
		Delivery: 1,
		Acker:    &acker{m: jm, s: s},
	}
	if len(h) > 0 {
		m.Headers = make(map[string]string, len(h))
		for k, vs := range h {
			if len(vs) == 0 {
				continue
			}
			switch k {
			case jetstream.MsgIDHeader:
				m.ID = vs[0]
				continue
			case HeaderKey:
				if key, err := base64.StdEncoding.DecodeString(vs[0]); err == nil {
					m.Key = key
				}
				continue
			}
			m.Headers[k] = vs[0]
		}
	}
	if m.ID == "" {
		m.ID = m.Headers[broker.HeaderMessageID]
	}
	if md, err := jm.Metadata(); err == nil {
		m.Delivery = int(md.NumDelivered)
		m.PublishedAt = md.Timestamp
	}
	return m
}

// Close stops fetching and flushes pending acks. Unsettled deliveries are
// redelivered to the group after AckWait.
func (s *Subscriber) Close() error {
	var err error
	s.once.Do(func() {
		s.close()
		s.wg.Wait()
		if nc := s.cfg.JS.Conn(); nc != nil && !nc.IsClosed() {
			err = nc.FlushTimeout(5 * time.Second)
		}
	})
	if err != nil {
		return fmt.Errorf("natsbroker: flush acks on close: %w", err)
	}
	return nil
}

type acker struct {
	m       jetstream.Msg
	s       *Subscriber
	settled atomic.Bool
}

func (a *acker) settle(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !a.settled.CompareAndSwap(false, true) {
		return nil
	}
	if err := f(); err != nil {
		a.settled.Store(false)
		return fmt.Errorf("natsbroker: %w", err)
	}
	return nil
}

func (a *acker) Ack(ctx context.Context) error {
	return a.settle(ctx, func() error {
		if a.s.cfg.AckSync {
			return a.m.DoubleAck(ctx)
		}
		return a.m.Ack()
	})
}

func (a *acker) Nak(ctx context.Context, delay time.Duration) error {
	return a.settle(ctx, func() error {
		if delay <= 0 {
			return a.m.Nak()
		}
		return a.m.NakWithDelay(delay)
	})
}

// Term sends +TERM with the reason where the connected server honours one
// (2.10.4 and later), and a plain +TERM otherwise: older servers ignore a
// term that carries a reason and would redeliver the message every AckWait
// until MaxDeliver. The version is read at each call, so a reconnect to
// another server is followed.
func (a *acker) Term(ctx context.Context, reason string) error {
	return a.settle(ctx, func() error {
		if a.s.termWithReason() {
			return a.m.TermWithReason(reason)
		}
		a.s.cfg.Logger.Debug("natsbroker: plain term (the server takes no reason)", "stream", a.s.cfg.Stream, "durable", a.s.cfg.Durable, "reason", reason)
		return a.m.Term()
	})
}

// termWithReason reports whether a term may carry its reason.
func (s *Subscriber) termWithReason() bool {
	if s.cfg.NoTermReason {
		return false
	}
	nc := s.cfg.JS.Conn()
	return nc != nil && atLeast(nc.ConnectedServerVersion(), termReasonVersion)
}

func (a *acker) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if a.settled.Load() {
		return nil
	}
	if err := a.m.InProgress(); err != nil {
		return fmt.Errorf("natsbroker: in progress: %w", err)
	}
	return nil
}

var (
	_ broker.Publisher       = (*Publisher)(nil)
	_ broker.Subscriber      = (*Subscriber)(nil)
	_ broker.DeliveryLimiter = (*Subscriber)(nil)
	_ broker.Readier         = (*Subscriber)(nil)
)
