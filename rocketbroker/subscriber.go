package rocketbroker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
)

// ErrDeliveryLost is returned when settling a delivery the subscriber can
// no longer settle (it was closed): the broker redelivers the message from
// the group's committed offset. It wraps broker.ErrDeliveryLost.
var ErrDeliveryLost = fmt.Errorf("rocketbroker: subscriber closed (%w)", broker.ErrDeliveryLost)

// Subscriber is a push consumer in clustering mode for one consumer group,
// bridged to the pull model of broker.Subscriber: the client calls a
// consume callback per message (ConsumeMessageBatchMaxSize 1), which hands
// the message to Fetch through a bounded channel and blocks until the
// message is settled; only then does it return the consume status, so the
// status is the effect's: ConsumeSuccess after Ack, ConsumeRetryLater
// (with the nak's delay level) after Nak. Each outstanding delivery holds
// one of the client's consume goroutines (MaxInFlight per topic).
type Subscriber struct {
	cfg SubscriberConfig
	ch  chan *delivery

	stopping chan struct{} // Close began: Fetch returns ErrClosed
	released chan struct{} // the consumer is shut down: callbacks return
	ready    chan struct{} // the push consumer started
	startErr atomic.Pointer[error]

	mu        sync.Mutex
	pc        rocketmq.PushConsumer
	closeOnce sync.Once
	closeErr  error

	callbacks sync.WaitGroup
	cbMu      sync.Mutex
	cbClosed  bool // Close waits for the callbacks: no new one may start
	starter   sync.WaitGroup
	pending   atomic.Int64 // deliveries handed out, not settled
	starts    atomic.Int64

	// Settled deliveries whose consume callback has not returned yet
	// (returning), and those whose callback returned in the last
	// settleWindow (recent, oldest first): Close waits until the client
	// has recorded them (see drain).
	smu       sync.Mutex
	returning int
	recent    []settledRef

	lastRebalance atomic.Int64 // unix ns of the last queue allocation (or start)
}

// settledRef is a settled delivery's queue and offset.
type settledRef struct {
	mq     primitive.MessageQueue
	offset int64
	redo   bool // consumed again by the client (an orderly nak)
	at     time.Time
}

// settleWindow bounds how long after its callback returned the client may
// still be recording a settled delivery: a send-back (3s) and its fallback
// send (3s).
const settleWindow = 10 * time.Second

// NewSubscriber checks cfg and starts the push consumer in the background:
// while the name server cannot be reached or a topic has no route yet, it
// tries again every StartRetry (WaitReady tells when it is running).
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	installLog()
	s := &Subscriber{
		cfg:      cfg,
		ch:       make(chan *delivery, cfg.MaxInFlight),
		stopping: make(chan struct{}),
		released: make(chan struct{}),
		ready:    make(chan struct{}),
	}
	s.starter.Add(1)
	go s.start()
	return s, nil
}

func (s *Subscriber) options() []consumer.Option {
	cfg := s.cfg
	from := consumer.ConsumeFromFirstOffset
	if cfg.StartFrom == StartFromLast {
		from = consumer.ConsumeFromLastOffset
	}
	opts := []consumer.Option{
		consumer.WithNameServer(cfg.NameServers),
		consumer.WithGroupName(cfg.Group),
		consumer.WithInstance(instanceName("consumer")),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(from),
		consumer.WithConsumerOrder(cfg.Orderly),
		// One message per callback: the consume status is per message
		// (seed 000: consumeMessageBatchMaxSize=1).
		consumer.WithConsumeMessageBatchMaxSize(1),
		consumer.WithConsumeGoroutineNums(cfg.MaxInFlight),
		consumer.WithConsumeTimeout(cfg.ConsumeTimeout),
		consumer.WithPullBatchSize(int32(cfg.PullBatchSize)),
		consumer.WithConsumeConcurrentlyMaxSpan(cfg.MaxSpan),
		consumer.WithAutoCommit(true),
		consumer.WithStrategy(s.allocate),
	}
	if cfg.MaxReconsumeTimes > 0 {
		opts = append(opts, consumer.WithMaxReconsumeTimes(int32(cfg.MaxReconsumeTimes)))
	}
	if cfg.AccessKey != "" {
		opts = append(opts, consumer.WithCredentials(credentials(cfg.Client)))
	}
	return opts
}

// allocate is the client's default queue allocation (averagely), noting
// when a rebalance ran (see quiesce).
func (s *Subscriber) allocate(group, id string, mqs []*primitive.MessageQueue, ids []string) []*primitive.MessageQueue {
	s.lastRebalance.Store(time.Now().UnixNano())
	return consumer.AllocateByAveragely(group, id, mqs, ids)
}

// start creates and starts push consumers until one runs or Close.
func (s *Subscriber) start() {
	defer s.starter.Done()
	for {
		err := s.startOnce()
		if err == nil {
			close(s.ready)
			return
		}
		if errors.Is(err, broker.ErrClosed) {
			return
		}
		s.startErr.Store(&err)
		s.cfg.Logger.Warn("rocketbroker: consumer not started; retrying", "group", s.cfg.Group, "err", err)
		t := time.NewTimer(s.cfg.StartRetry)
		select {
		case <-t.C:
		case <-s.stopping:
			t.Stop()
			return
		}
	}
}

func (s *Subscriber) startOnce() error {
	pc, err := rocketmq.NewPushConsumer(s.options()...)
	if err != nil {
		return err
	}
	for _, t := range s.cfg.Topics {
		if err := pc.Subscribe(t, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"}, s.consume); err != nil {
			return err // not started: nothing to shut down (Shutdown would fail on it)
		}
	}
	s.mu.Lock()
	select {
	case <-s.stopping:
		s.mu.Unlock()
		return broker.ErrClosed
	default:
	}
	if err := pc.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
	}
	// The group's retry topic is created by the broker on the first
	// heartbeat, which Start sends after looking routes up; the client
	// would find its route only at its next refresh (30s), leaving nak'ed
	// messages undelivered until then. Start again (the client's start-up
	// is done once; the route refresh, heartbeat and rebalance that end
	// Start run again) to pick the retry topic up now.
	_ = pc.Start()
	s.lastRebalance.Store(time.Now().UnixNano())
	s.pc = pc
	s.starts.Add(1)
	s.mu.Unlock()
	return nil
}

// WaitReady waits until the push consumer is running (subscribed, routes
// found, first rebalance under way), or ctx ends (its error, with the last
// start error).
func (s *Subscriber) WaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-s.stopping:
		return broker.ErrClosed
	case <-ctx.Done():
		if p := s.startErr.Load(); p != nil {
			return fmt.Errorf("%w (last start error: %w)", ctx.Err(), *p)
		}
		return ctx.Err()
	}
}

// RedeliveryWindow implements broker.Subscriber (see
// SubscriberConfig.RedeliveryWindow).
func (s *Subscriber) RedeliveryWindow() time.Duration { return s.cfg.RedeliveryWindow() }

// MaxDeliveries implements broker.DeliveryLimiter: a nak on a message's
// MaxDeliveries-th delivery sends it to %DLQ%<group>, so the consumer
// runtime never naks it there (it holds it and dead-letters it itself).
func (s *Subscriber) MaxDeliveries() int { return s.cfg.MaxDeliveries() }

// Config returns the subscriber's configuration with defaults applied.
func (s *Subscriber) Config() SubscriberConfig { return s.cfg }

// Fetch waits for the first delivery, then returns what else is waiting,
// up to max.
func (s *Subscriber) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if max <= 0 {
		max = 1
	}
	select {
	case <-s.stopping:
		return nil, broker.ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*broker.Message
	select {
	case d := <-s.ch:
		out = append(out, d.msg)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.stopping:
		return nil, broker.ErrClosed
	}
	for len(out) < max {
		select {
		case d := <-s.ch:
			out = append(out, d.msg)
		default:
			return out, nil
		}
	}
	return out, nil
}

// outcome is how a delivery was settled.
type outcome int

const (
	pending outcome = iota
	acked
	naked
	termed
	abandoned // the subscriber closed first
)

// delivery is one consume callback waiting for its message to be settled.
type delivery struct {
	s     *Subscriber
	ext   *primitive.MessageExt
	msg   *broker.Message
	done  chan struct{}
	mu    sync.Mutex
	state outcome
	delay time.Duration
}

// settle records o unless the delivery is settled already; it reports
// whether it did, and ErrDeliveryLost if the subscriber gave up on it.
func (d *delivery) settle(ctx context.Context, o outcome, delay time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch d.state {
	case pending:
		d.state, d.delay = o, delay
		d.s.pending.Add(-1)
		d.s.smu.Lock()
		d.s.returning++
		d.s.smu.Unlock()
		close(d.done)
		return nil
	case abandoned:
		return ErrDeliveryLost
	}
	return nil // settled before: no effect
}

// abandon gives up on the delivery (Close) unless it was settled.
func (d *delivery) abandon() outcome {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == pending {
		d.state = abandoned
		d.s.pending.Add(-1)
		close(d.done)
	}
	return d.state
}

// consume is the push consumer's callback. It is called with one message
// (ConsumeMessageBatchMaxSize 1) and returns only once the message is
// settled or the subscriber closed.
func (s *Subscriber) consume(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
	s.cbMu.Lock()
	if s.cbClosed {
		s.cbMu.Unlock()
		// Shut down: the client ignores what we return.
		return consumer.ConsumeRetryLater, broker.ErrClosed
	}
	s.callbacks.Add(1)
	s.cbMu.Unlock()
	defer s.callbacks.Done()
	if len(msgs) != 1 {
		// Not with this configuration; settle nothing we were not asked
		// to, and let the client redeliver.
		return s.retryResult(ctx, msgs, 1), fmt.Errorf("rocketbroker: %d messages in one callback", len(msgs))
	}
	ext := msgs[0]
	d := &delivery{s: s, ext: ext, done: make(chan struct{})}
	d.msg = s.toMessage(ext, d)
	s.pending.Add(1)
	select {
	case s.ch <- d:
	case <-s.released:
		d.abandon()
		return consumer.ConsumeRetryLater, broker.ErrClosed
	}
	select {
	case <-d.done:
	case <-s.released:
	}
	o := d.abandon()
	if o != abandoned {
		defer s.returned(ext, o == naked && s.cfg.Orderly)
	}
	switch o {
	case acked:
		return consumer.ConsumeSuccess, nil
	case naked:
		return s.retryResult(ctx, msgs, s.cfg.DelayLevel(d.delay)), nil
	case termed:
		if s.cfg.Term == TermAck {
			return consumer.ConsumeSuccess, nil
		}
		return s.deadLetterResult(ctx, ext), nil
	}
	// Closed before it was settled: the consumer is shut down and its
	// queues dropped, so the client ignores what we return; the message
	// comes back from the group's committed offset.
	return consumer.ConsumeRetryLater, broker.ErrClosed
}

// returned records that the callback of a settled delivery of ext is
// returning its status to the client.
func (s *Subscriber) returned(ext *primitive.MessageExt, redo bool) {
	now := time.Now()
	ref := settledRef{offset: ext.QueueOffset, redo: redo, at: now}
	if ext.Queue != nil {
		ref.mq = *ext.Queue
	}
	s.smu.Lock()
	defer s.smu.Unlock()
	s.returning--
	i := 0
	for i < len(s.recent) && now.Sub(s.recent[i].at) > settleWindow {
		i++
	}
	s.recent = append(s.recent[i:], ref)
}

// retryResult asks the client to redeliver msgs after delay level level:
// concurrently a send-back to the retry topic with that level, in orderly
// mode a suspension of the queue for the level's delay.
func (s *Subscriber) retryResult(ctx context.Context, msgs []*primitive.MessageExt, level int) consumer.ConsumeResult {
	if oc, ok := primitive.GetOrderlyCtx(ctx); ok {
		oc.SuspendCurrentQueueTimeMillis = int(s.cfg.DelayLevels[level-1].Milliseconds())
		return consumer.SuspendCurrentQueueAMoment
	}
	if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
		cc.DelayLevelWhenNextConsume = level
	}
	return consumer.ConsumeRetryLater
}

// deadLetterResult sends ext to %DLQ%<group>: concurrently a send-back
// with delay level -1; in orderly mode a suspension with the reconsume
// times past the maximum, which makes the client send it back with -1.
// Without a limit (orderly, MaxReconsumeTimes -1) it is consumed instead.
func (s *Subscriber) deadLetterResult(ctx context.Context, ext *primitive.MessageExt) consumer.ConsumeResult {
	if _, ok := primitive.GetOrderlyCtx(ctx); ok {
		limit := s.cfg.reconsumeLimit()
		if limit >= 1<<31-2 {
			return consumer.ConsumeSuccess
		}
		ext.ReconsumeTimes = int32(limit + 1)
		return consumer.SuspendCurrentQueueAMoment
	}
	if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
		cc.DelayLevelWhenNextConsume = -1
	}
	return consumer.ConsumeRetryLater
}

// toMessage converts a consumed message: its id from idem-message-id (or
// the client's message id for messages from other producers), key from
// idem-key (or SHARDING_KEY), the user properties as headers, Delivery =
// reconsume times + 1.
func (s *Subscriber) toMessage(ext *primitive.MessageExt, d *delivery) *broker.Message {
	props := ext.GetProperties()
	m := &broker.Message{
		ID:          props[broker.HeaderMessageID],
		Topic:       ext.Topic,
		Payload:     ext.Body,
		Delivery:    int(ext.ReconsumeTimes) + 1,
		PublishedAt: time.UnixMilli(ext.BornTimestamp),
		Acker:       &acker{d: d},
	}
	if m.ID == "" {
		m.ID = ext.MsgId
	}
	if k, ok := props[HeaderKey]; ok {
		if key, err := base64.StdEncoding.DecodeString(k); err == nil {
			m.Key = key
		}
	} else if k := props["SHARDING_KEY"]; k != "" {
		m.Key = []byte(k)
	}
	for k, v := range props {
		if systemProperties[k] {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(props))
		}
		m.Headers[k] = v
	}
	return m
}

// Close shuts the push consumer down (its queues are dropped and their
// offsets persisted: the lowest unsettled message of each queue and
// everything after it will be delivered again, to this group's next
// member), waits until the broker reports those offsets (see
// confirmOffsets), then releases the consume callbacks of unsettled
// deliveries, whose Ackers return ErrDeliveryLost from then on.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		close(s.stopping)
		s.starter.Wait()
		s.mu.Lock()
		pc := s.pc
		s.mu.Unlock()
		if pc != nil {
			s.drain(pc)
			s.quiesce(pc)
			want := clientOffsets(pc)
			s.closeErr = pc.Shutdown()
			s.confirmOffsets(want)
		}
		close(s.released)
		s.cbMu.Lock()
		s.cbClosed = true
		s.cbMu.Unlock()
		s.callbacks.Wait()
	})
	return s.closeErr
}

// drain waits, up to settleWindow, until the client has recorded every
// delivery settled before Close: its callback returned and the client
// moved the queue's offset past it (after a send-back for a nak or a
// term). Shutdown drops the queues and commits their offsets as they are
// then, and the client ignores the statuses of callbacks that return
// later, so without the wait a message acked just before Close would be
// delivered again to the group's next member.
func (s *Subscriber) drain(pc rocketmq.PushConsumer) {
	deadline := time.Now().Add(settleWindow)
	for {
		s.smu.Lock()
		returning, recent := s.returning, slices.Clone(s.recent)
		s.smu.Unlock()
		done := returning == 0
		if done && len(recent) > 0 {
			view, ok := clientView(pc)
			if !ok {
				return // unknown client version: do not wait
			}
			for _, r := range recent {
				if !recorded(view, r) {
					done = false
					break
				}
			}
		}
		if done || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// quiesce suspends the consumer (no new rebalance starts) and waits until
// no rebalance has been seen for rebalanceQuiet (at most settleWindow).
// The client's Shutdown sets a plain field that its rebalances read on
// every request they make (rmqClient.close): a rebalance under way while
// the consumer shuts down is a data race (reported by the race detector;
// harmless otherwise: the request fails or goes through). Rebalances run
// after Start, every 20s, and when the broker reports a member joining or
// leaving; on a healthy broker they take milliseconds.
//
// A rebalance is seen only when it allocates, after its request for the
// group's members: one that began before Suspend (a member left just
// before this Close) and still waits for that answer is invisible here.
// So quiesce also waits rebalanceQuiet after Suspend, which covers such
// a request on a loaded machine (the race detector caught one in CI,
// brokertest ConsumerGroupSplitsWork, whose subscribers close one after
// the other). A rebalance slower than that can still race: harmless.
func (s *Subscriber) quiesce(pc rocketmq.PushConsumer) {
	pc.Suspend()
	suspended := time.Now()
	deadline := suspended.Add(settleWindow)
	for time.Now().Before(deadline) {
		quiet := min(time.Since(time.Unix(0, s.lastRebalance.Load())), time.Since(suspended))
		if quiet >= rebalanceQuiet {
			return
		}
		time.Sleep(rebalanceQuiet - quiet)
	}
}

const rebalanceQuiet = 300 * time.Millisecond

// recorded reports whether the client's view of r's queue shows r done:
// the queue's (in-memory) commit offset is past it, or a message before
// it is still cached (so the commit offset cannot pass it anyway), or the
// client consumes it again (it is still to be settled then).
func recorded(view map[primitive.MessageQueue]queueView, r settledRef) bool {
	v, ok := view[r.mq]
	if !ok || r.redo {
		return true // the queue is no longer this member's
	}
	return v.commit > r.offset || (v.cached > 0 && v.cachedMin < r.offset)
}

// queueView is what the client reports about one of its queues.
type queueView struct {
	commit, cachedMin int64
	cached            int64
}

// clientView reads the push consumer's queues from its
// GetConsumerRunningInfo (the running info the broker can ask a client
// for: each queue's in-memory commit offset and cached messages). Its type
// lives in the client's internal package, so it is read by reflection;
// false if the client has no such method or fields.
func clientView(pc rocketmq.PushConsumer) (view map[primitive.MessageQueue]queueView, ok bool) {
	defer func() {
		if recover() != nil {
			view, ok = nil, false
		}
	}()
	m := reflect.ValueOf(pc).MethodByName("GetConsumerRunningInfo")
	if !m.IsValid() {
		return nil, false
	}
	out := m.Call([]reflect.Value{reflect.ValueOf(false)})
	if len(out) != 1 || out[0].Kind() != reflect.Pointer || out[0].IsNil() {
		return nil, false
	}
	table := out[0].Elem().FieldByName("MQTable")
	if table.Kind() != reflect.Map {
		return nil, false
	}
	view = map[primitive.MessageQueue]queueView{}
	it := table.MapRange()
	for it.Next() {
		mq, isMQ := it.Key().Interface().(primitive.MessageQueue)
		info := it.Value()
		if !isMQ || info.Kind() != reflect.Struct {
			return nil, false
		}
		view[mq] = queueView{
			commit:    info.FieldByName("CommitOffset").Int(),
			cachedMin: info.FieldByName("CachedMsgMinOffset").Int(),
			cached:    info.FieldByName("CachedMsgCount").Int(),
		}
	}
	return view, true
}

// clientOffsets is the commit offset the client holds for each of its
// queues that has one: what its Shutdown sends the broker.
func clientOffsets(pc rocketmq.PushConsumer) map[primitive.MessageQueue]int64 {
	view, ok := clientView(pc)
	if !ok {
		return nil
	}
	want := map[primitive.MessageQueue]int64{}
	for mq, v := range view {
		if v.commit > 0 {
			want[mq] = v.commit
		}
	}
	return want
}

// confirmOffsets waits, up to settleWindow, until the broker reports for
// each queue in want a committed offset of at least want's, and commits
// it itself when the broker does not. The client's Shutdown sends its
// offsets one way (UPDATE_CONSUMER_OFFSET, the answer never read) and
// closes its connections right after: the broker applies them on an
// executor of its own, late (the group's next member, started once Close
// returns, could query the offsets before they were applied), or never
// reads them (its end of the connection was closed first: a pull answer
// written to the closed client fails; 1 run in ~40 of brokertest's
// NoAckBeforeEffect under load lost them). Either way the next member
// would get every message acked since the last periodic commit (5s)
// again. So a queue still behind gets the same offset sent again, as a
// request whose answer is awaited, then once a second while it stays
// behind. It gives up at once when the broker cannot be asked (no route,
// a request error, an answer other than an offset or "none yet"): the
// wait is for a lagging or lost update, not for a broker that is gone.
// With ACLs it does not ask: its requests are not signed.
//
// Sending an offset again can move a queue back if another member, given
// the queue by the rebalance this Close set off, committed past it in
// between the query and the update: that member's messages from there on
// are delivered again (never lost), and its next commit (5s) moves the
// offset forward again.
func (s *Subscriber) confirmOffsets(want map[primitive.MessageQueue]int64) {
	if len(want) == 0 || s.cfg.AccessKey != "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleWindow)
	defer cancel()
	conns := newConnCache(ctx)
	defer conns.close()
	routes := map[string]*topicRoute{}
	giveUp := func(err error) {
		s.cfg.Logger.Warn("rocketbroker: offsets not confirmed at Close; the group's next member may get acked messages again",
			"group", s.cfg.Group, "queues", len(want), "err", err)
	}
	resent := map[primitive.MessageQueue]time.Time{}
	for {
		for mq, off := range want {
			r := routes[mq.Topic]
			if r == nil {
				var err error
				if r, err = lookupRoute(ctx, s.cfg.Client, conns.dial, mq.Topic); err != nil {
					giveUp(err)
					return
				}
				routes[mq.Topic] = r
			}
			addr := r.brokers[mq.BrokerName]
			if addr == "" {
				giveUp(fmt.Errorf("no address for broker %s", mq.BrokerName))
				return
			}
			bc, err := conns.dial(addr)
			if err != nil {
				giveUp(err)
				return
			}
			q := map[string]string{"consumerGroup": s.cfg.Group, "topic": mq.Topic, "queueId": strconv.Itoa(mq.QueueId), "bname": mq.BrokerName}
			got, err := offsetRequest(ctx, bc, remoting.QueryConsumerOffset, q)
			switch {
			case errors.Is(err, errNotFound):
			case err != nil:
				giveUp(err)
				return
			case got >= off:
				delete(want, mq)
				continue
			}
			if at, ok := resent[mq]; ok && time.Since(at) < time.Second {
				continue
			}
			resent[mq] = time.Now()
			q["commitOffset"] = strconv.FormatInt(off, 10)
			if err := commitOffset(ctx, bc, q); err != nil {
				giveUp(err)
				return
			}
		}
		if len(want) == 0 {
			return
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			giveUp(ctx.Err())
			return
		}
	}
}

// commitOffset sends an UPDATE_CONSUMER_OFFSET and waits for its answer.
func commitOffset(ctx context.Context, c *remoting.Conn, ext map[string]string) error {
	resp, err := c.Invoke(ctx, newRequest(remoting.UpdateConsumerOffset, ext))
	if err != nil {
		return fmt.Errorf("rocketbroker: update consumer offset: %w", err)
	}
	if resp.Code != remoting.Success {
		return fmt.Errorf("rocketbroker: update consumer offset: code %d: %s", resp.Code, resp.Remark)
	}
	return nil
}

// Started is how many times the push consumer started (1 once running).
func (s *Subscriber) Started() int { return int(s.starts.Load()) }

type acker struct{ d *delivery }

// Ack implements broker.Acker: the callback returns ConsumeSuccess and the
// client advances the queue's offset (committed to the broker within 5s,
// or at Close).
func (a *acker) Ack(ctx context.Context) error { return a.d.settle(ctx, acked, 0) }

// Nak implements broker.Acker: the callback returns ConsumeRetryLater with
// the smallest delay level of at least delay (level 1, 1s, for 0): the
// client sends the message back, the broker stores a copy in the group's
// retry topic with reconsume times + 1 and delivers it after the level's
// delay. In orderly mode the queue is suspended for the level's delay and
// the message delivered again (SuspendCurrentQueueAMoment).
func (a *acker) Nak(ctx context.Context, delay time.Duration) error {
	return a.d.settle(ctx, naked, delay)
}

// Term implements broker.Acker per SubscriberConfig.Term.
func (a *acker) Term(ctx context.Context, reason string) error { return a.d.settle(ctx, termed, 0) }

// InProgress implements broker.Acker: it restarts the client's consume
// clock of the message (CONSUME_START_TIME), so the client does not send
// it back after ConsumeTimeout while it is being worked on.
func (a *acker) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	a.d.mu.Lock()
	defer a.d.mu.Unlock()
	switch a.d.state {
	case pending:
		a.d.ext.WithProperty(primitive.PropertyConsumeStartTime, strconv.FormatInt(time.Now().UnixMilli(), 10))
	case abandoned:
		return ErrDeliveryLost
	}
	return nil
}

var (
	_ broker.Subscriber      = (*Subscriber)(nil)
	_ broker.DeliveryLimiter = (*Subscriber)(nil)
)
