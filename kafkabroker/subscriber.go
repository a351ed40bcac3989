package kafkabroker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Subscriber consumes as a member of a consumer group with manual commits:
// only the contiguous prefix of settled (acked or termed) offsets of each
// partition is ever committed. Nak keeps the offset uncommitted and hands the
// same record out again from memory after the delay. See docs/kafkabroker.md.
//
// Fetch is meant for one consumer loop (concurrent calls are serialised);
// Ackers may be used from any goroutine.
type Subscriber struct {
	cfg SubscriberConfig
	cl  *kgo.Client
	// cancelClient ends the client's context (kgo.WithContext): a Close
	// out of time cuts the group's in-flight join or sync with it.
	cancelClient context.CancelFunc
	// user holds the partition callbacks given in ClientOpts; the
	// subscriber's own call them after doing their work.
	user partitionCallbacks

	// pollMu is held by Fetch across PollRecords and the registration of
	// what it returned, and by the partition callbacks, so records polled
	// before a revoke are never registered after it.
	pollMu  sync.Mutex
	fetchMu sync.Mutex // one Fetch at a time
	// commitMu orders commits: offsets are collected and committed under
	// it, so a later commit never carries an older offset.
	commitMu sync.Mutex

	mu          sync.Mutex
	parts       map[topicPartition]*partition
	redeliver   dueHeap
	unsettled   int // handed out or waiting, over live partitions
	wake        chan struct{}
	watched     bool // someone waits on wake
	rebalancing int
	pollCancel  context.CancelFunc
	pollDue     time.Time // when the running poll is cut short for a redelivery
	closed      bool
	closeCh     chan struct{}
	// joined: the member has joined the group and has its assignment
	// (onAssigned ran) and has not lost it since; readyCh is closed while
	// it is true. lastErr is the latest connection or group error.
	joined  bool
	readyCh chan struct{}
	lastErr error

	wg sync.WaitGroup

	onCommitted func(topicPartition, int64) // test hook, called under mu
}

var (
	_ broker.Subscriber = (*Subscriber)(nil)
	_ broker.Readier    = (*Subscriber)(nil)
)

type topicPartition struct {
	topic     string
	partition int32
}

type partition struct {
	topicPartition
	t        *tracker
	draining bool          // being revoked: hand nothing more out
	dead     bool          // revoked or lost: settles are ignored (ErrDeliveryLost)
	gone     chan struct{} // closed when dead is set (broker.LostNotifier)
}

// NewSubscriber joins the group in the background and returns at once;
// Fetch returns records once partitions are assigned.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Subscriber{
		cfg:     cfg,
		parts:   make(map[topicPartition]*partition),
		wake:    make(chan struct{}),
		closeCh: make(chan struct{}),
		readyCh: make(chan struct{}),
	}
	reset := kgo.NewOffset().AtStart()
	if cfg.StartAtEnd {
		reset = kgo.NewOffset().AtEnd()
	}
	iso := kgo.ReadCommitted()
	if cfg.ReadUncommitted {
		iso = kgo.ReadUncommitted()
	}
	user, err := userCallbacks(cfg.ClientOpts)
	if err != nil {
		return nil, err
	}
	s.user = user
	opts := append(slices.Clone(cfg.ClientOpts),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.WithLogger(slogLogger{cfg.Logger}),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(iso),
		kgo.ConsumeResetOffset(reset),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.RebalanceTimeout(cfg.RebalanceTimeout),
		kgo.HeartbeatInterval(cfg.HeartbeatInterval),
		kgo.FetchMaxPartitionBytes(int32(cfg.MaxMessageBytes)),
		kgo.FetchMaxBytes(int32(max(cfg.MaxMessageBytes, 50<<20))),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.WithHooks(readyHooks{s}),
	)
	clientCtx, cancelClient := context.WithCancel(context.Background())
	opts = append(opts, kgo.WithContext(clientCtx))
	var cl *kgo.Client
	cl, err = kgo.NewClient(opts...)
	if err != nil {
		cancelClient()
		return nil, fmt.Errorf("%w: kafkabroker: %w", idem.ErrInvalidArgument, err)
	}
	s.cl, s.cancelClient = cl, cancelClient
	s.wg.Add(1)
	go s.commitLoop()
	return s, nil
}

// WaitReady implements broker.Readier: it returns nil once the member has
// joined the group and received its assignment (possibly empty, when the
// group has more members than partitions), at once if it has, and waits
// meanwhile: an unreachable broker at start is not an error, franz-go
// keeps dialing and joining. When ctx ends first it returns ctx's error
// with the last connection or group error; after Close, broker.ErrClosed.
// A member whose partitions were lost (session expired) is not ready until
// it has joined again.
func (s *Subscriber) WaitReady(ctx context.Context) error {
	for {
		s.mu.Lock()
		closed, joined, ch := s.closed, s.joined, s.readyCh
		s.mu.Unlock()
		switch {
		case closed:
			return broker.ErrClosed
		case joined:
			return nil
		}
		select {
		case <-ch:
		case <-s.closeCh:
			return broker.ErrClosed
		case <-ctx.Done():
			s.mu.Lock()
			last := s.lastErr
			s.mu.Unlock()
			if last != nil {
				return fmt.Errorf("kafkabroker: group %s not joined: %w (last error: %w)", s.cfg.Group, ctx.Err(), last)
			}
			return fmt.Errorf("kafkabroker: group %s not joined: %w", s.cfg.Group, ctx.Err())
		}
	}
}

// setJoinedLocked records whether the member is in the group with an assignment.
func (s *Subscriber) setJoinedLocked(joined bool) {
	if joined == s.joined {
		return
	}
	s.joined = joined
	if joined {
		close(s.readyCh)
	} else {
		s.readyCh = make(chan struct{})
	}
}

// readyHooks keeps the latest connection and group errors for WaitReady.
type readyHooks struct{ s *Subscriber }

func (h readyHooks) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		h.s.mu.Lock()
		h.s.lastErr = err
		h.s.mu.Unlock()
	}
}

func (h readyHooks) OnGroupManageError(err error) {
	h.s.mu.Lock()
	h.s.lastErr = err
	h.s.mu.Unlock()
}

// RedeliveryWindow is SubscriberConfig.RedeliveryWindow.
func (s *Subscriber) RedeliveryWindow() time.Duration { return s.cfg.RedeliveryWindow() }

// Fetch returns up to n deliveries: nak'd messages whose delay has passed
// first, then new records. It blocks until there is at least one, ctx ends
// (ctx's error) or the subscriber closes (broker.ErrClosed), and while
// MaxUnsettled deliveries are unsettled.
func (s *Subscriber) Fetch(ctx context.Context, n int) ([]*broker.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n = max(n, 1)
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, broker.ErrClosed
		}
		now := time.Now()
		if msgs := s.dueLocked(n, now); len(msgs) > 0 {
			s.mu.Unlock()
			return msgs, nil
		}
		var nextDue time.Time
		if len(s.redeliver) > 0 {
			nextDue = s.redeliver[0].due
		}
		room := s.cfg.MaxUnsettled - s.unsettled
		if s.rebalancing > 0 || room <= 0 {
			wake := s.watchLocked()
			s.mu.Unlock()
			if err := s.wait(ctx, wake, nextDue); err != nil {
				return nil, err
			}
			continue
		}
		var pctx context.Context
		var cancel context.CancelFunc
		if nextDue.IsZero() {
			pctx, cancel = context.WithCancel(ctx)
		} else {
			// Cut the poll short when the next nak'd delivery falls due.
			pctx, cancel = context.WithDeadline(ctx, nextDue)
		}
		s.pollCancel, s.pollDue = cancel, nextDue
		s.mu.Unlock()

		s.pollMu.Lock()
		fetches := s.cl.PollRecords(pctx, min(n, room))
		msgs := s.register(fetches)
		s.pollMu.Unlock()

		s.mu.Lock()
		s.pollCancel, s.pollDue = nil, time.Time{}
		closed := s.closed
		s.mu.Unlock()
		cancel()
		if len(msgs) > 0 {
			return msgs, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if closed || fetches.IsClientClosed() {
			return nil, broker.ErrClosed
		}
		failed := false
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				failed = true
				s.cfg.Logger.Warn("kafkabroker: fetch error", "topic", topic, "partition", part, "err", err)
			}
		})
		if failed {
			// franz-go retries on its own; do not spin on a poll that
			// keeps failing at once.
			s.mu.Lock()
			wake := s.watchLocked()
			s.mu.Unlock()
			if err := s.wait(ctx, wake, time.Now().Add(fetchErrorPause)); err != nil {
				return nil, err
			}
		}
	}
}

// fetchErrorPause is how long Fetch waits after a poll that returned only
// errors before polling again.
const fetchErrorPause = 100 * time.Millisecond

// wait blocks until something changes (a settle, a rebalance ending), the
// next redelivery is due, ctx ends or the subscriber closes.
func (s *Subscriber) wait(ctx context.Context, wake <-chan struct{}, due time.Time) error {
	var timer <-chan time.Time
	if !due.IsZero() {
		t := time.NewTimer(time.Until(due))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closeCh:
		return broker.ErrClosed
	case <-wake:
	case <-timer:
	}
	return nil
}

// watchLocked returns a channel closed at the next state change (a settle,
// a rebalance ending, Close).
func (s *Subscriber) watchLocked() <-chan struct{} {
	s.watched = true
	return s.wake
}

// wakeLocked tells a waiting Fetch (or revoke drain) that state changed. It
// costs nothing when nobody waits, as on most acks.
func (s *Subscriber) wakeLocked() {
	if !s.watched {
		return
	}
	close(s.wake)
	s.wake = make(chan struct{})
	s.watched = false
}

// register tracks polled records and turns them into deliveries. Records of
// partitions being revoked or gone are dropped: the next owner fetches them
// from the last commit.
func (s *Subscriber) register(fs kgo.Fetches) []*broker.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*broker.Message
	fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
		p := s.parts[topicPartition{ftp.Topic, ftp.Partition}]
		if p == nil || p.dead || p.draining {
			return
		}
		for _, r := range ftp.Records {
			e := p.t.add(r.Offset, r.LeaderEpoch, r)
			if e == nil {
				continue
			}
			s.unsettled++
			out = append(out, s.message(p, e, r))
		}
	})
	return out
}

// dueLocked hands out nak'd deliveries whose delay has passed.
func (s *Subscriber) dueLocked(n int, now time.Time) []*broker.Message {
	var out []*broker.Message
	for len(out) < n && len(s.redeliver) > 0 && !s.redeliver[0].due.After(now) {
		d := heap.Pop(&s.redeliver).(due)
		if d.p.dead || d.p.draining || !d.p.t.redeliver(d.e) {
			continue
		}
		out = append(out, s.message(d.p, d.e, d.e.rec.(*kgo.Record)))
	}
	return out
}

func (s *Subscriber) message(p *partition, e *entry, r *kgo.Record) *broker.Message {
	m := &broker.Message{
		Topic:       r.Topic,
		Key:         r.Key,
		Payload:     r.Value,
		Delivery:    e.deliveries,
		PublishedAt: r.Timestamp,
		Acker:       &acker{s: s, p: p, e: e},
	}
	for _, h := range r.Headers {
		if h.Key == broker.HeaderMessageID {
			m.ID = string(h.Value)
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(r.Headers))
		}
		m.Headers[h.Key] = string(h.Value)
	}
	if m.ID == "" {
		// Not published by idem: the record's coordinates are stable
		// across redeliveries of this record (not across producer
		// retries that wrote it twice).
		m.ID = fmt.Sprintf("kafka:%s:%d:%d", r.Topic, r.Partition, r.Offset)
	}
	return m
}

// ErrDeliveryLost is returned by the Acker of a delivery whose partition
// was revoked or lost (a rebalance, an expired session, Close): the
// settle is ignored and the partition's next owner redelivers the record
// from the group's committed offset. It wraps broker.ErrDeliveryLost.
var ErrDeliveryLost = fmt.Errorf("kafkabroker: partition revoked (%w)", broker.ErrDeliveryLost)

// acker settles one delivery. Settling a delivery of a partition that was
// revoked or lost is ignored (ErrDeliveryLost): the new owner redelivers
// it.
type acker struct {
	s    *Subscriber
	p    *partition
	e    *entry
	done bool // guarded by s.mu
}

func (a *acker) Ack(context.Context) error {
	_, err := a.settle()
	return err
}

func (a *acker) Term(_ context.Context, reason string) error {
	ok, err := a.settle()
	if ok {
		a.s.cfg.Logger.Info("kafkabroker: message terminated", "topic", a.p.topic, "partition", a.p.partition, "offset", a.e.off, "reason", reason)
	}
	return err
}

// settle reports whether it settled the entry, and ErrDeliveryLost if its
// partition is gone.
func (a *acker) settle() (bool, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.done {
		return false, nil
	}
	if a.p.dead {
		return false, ErrDeliveryLost
	}
	a.done = true
	if !a.p.t.settle(a.e) {
		return false, nil
	}
	s.unsettled--
	s.wakeLocked()
	return true, nil
}

// Nak keeps the offset uncommitted (the commit stops before it) and hands
// the same record out again after delay, capped at MaxNakDelay.
func (a *acker) Nak(_ context.Context, delay time.Duration) error {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.done {
		return nil
	}
	if a.p.dead {
		return ErrDeliveryLost
	}
	a.done = true
	if !a.p.t.nak(a.e) {
		return nil
	}
	if delay > s.cfg.MaxNakDelay {
		s.cfg.Logger.Warn("kafkabroker: nak delay capped at MaxNakDelay", "delay", delay, "max", s.cfg.MaxNakDelay)
		delay = s.cfg.MaxNakDelay
	}
	d := due{due: time.Now().Add(max(delay, 0)), p: a.p, e: a.e}
	heap.Push(&s.redeliver, d)
	if s.pollCancel != nil && (s.pollDue.IsZero() || d.due.Before(s.pollDue)) {
		s.pollCancel() // the running poll would sleep past this redelivery
	}
	s.wakeLocked()
	return nil
}

// InProgress only reports a delivery whose partition was revoked or lost
// (ErrDeliveryLost): Kafka has no per-message deadline; group membership
// is kept alive by franz-go's heartbeats.
func (a *acker) InProgress(context.Context) error {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !a.done && a.p.dead {
		return ErrDeliveryLost
	}
	return nil
}

// Lost implements broker.LostNotifier: closed when the delivery's
// partition is revoked or lost.
func (a *acker) Lost() <-chan struct{} { return a.p.gone }

var _ broker.LostNotifier = (*acker)(nil)

// onAssigned starts tracking newly assigned partitions (franz-go fetches
// them from the group's committed offsets), then calls the caller's
// OnPartitionsAssigned.
func (s *Subscriber) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	s.assigned(assigned)
	if f := s.user.assigned; f != nil {
		f(ctx, cl, assigned)
	}
}

func (s *Subscriber) assigned(assigned map[string][]int32) {
	s.beginRebalance(nil)
	defer s.endRebalance()
	s.pollMu.Lock()
	defer s.pollMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, ps := range assigned {
		for _, n := range ps {
			k := topicPartition{topic, n}
			if old := s.parts[k]; old != nil {
				s.killLocked(old)
			}
			s.parts[k] = &partition{topicPartition: k, t: newTracker(), gone: make(chan struct{})}
		}
	}
	s.setJoinedLocked(true)
}

// onRevoked stops handing out the revoked partitions, waits up to
// RevokeDrain for deliveries with the handler to settle, then commits the
// settled prefix of every partition and forgets the revoked ones; then it
// calls the caller's OnPartitionsRevoked.
func (s *Subscriber) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	s.revoked(ctx, revoked)
	if f := s.user.revoked; f != nil {
		f(ctx, cl, revoked)
	}
}

func (s *Subscriber) revoked(ctx context.Context, revoked map[string][]int32) {
	parts := s.beginRebalance(revoked)
	defer s.endRebalance()
	s.pollMu.Lock()
	defer s.pollMu.Unlock()
	s.drain(parts)
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		// Close committed already and the client's context is ending.
		s.mu.Lock()
		for _, p := range parts {
			s.killLocked(p)
		}
		s.mu.Unlock()
		return
	}
	if err := s.commit(ctx, parts); err != nil {
		s.cfg.Logger.Warn("kafkabroker: commit on revoke failed; the next owner redelivers from the previous commit", "err", err)
	}
}

// onLost forgets partitions taken away without a clean revoke (session
// expired, fenced): a commit would be rejected, so none is tried. Then it
// calls the caller's OnPartitionsLost.
func (s *Subscriber) onLost(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
	s.lost(lost)
	if f := s.user.lost; f != nil {
		f(ctx, cl, lost)
	}
}

func (s *Subscriber) lost(lost map[string][]int32) {
	parts := s.beginRebalance(lost)
	defer s.endRebalance()
	s.pollMu.Lock()
	defer s.pollMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range parts {
		s.killLocked(p)
	}
	s.setJoinedLocked(false)
	if len(parts) > 0 {
		s.cfg.Logger.Warn("kafkabroker: partitions lost; their unsettled messages go to the next owner", "partitions", len(parts))
	}
}

// beginRebalance marks the given partitions draining and cuts a running poll
// short so the callback can take pollMu.
func (s *Subscriber) beginRebalance(tps map[string][]int32) []*partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rebalancing++
	var parts []*partition
	for topic, ps := range tps {
		for _, n := range ps {
			if p := s.parts[topicPartition{topic, n}]; p != nil {
				p.draining = true
				parts = append(parts, p)
			}
		}
	}
	if s.pollCancel != nil {
		s.pollCancel()
	}
	return parts
}

func (s *Subscriber) endRebalance() {
	s.mu.Lock()
	s.rebalancing--
	s.wakeLocked()
	s.mu.Unlock()
}

// drain waits up to RevokeDrain for the handler to settle what it holds of
// parts. Nak'd deliveries waiting for their delay are not waited for.
func (s *Subscriber) drain(parts []*partition) {
	if s.cfg.RevokeDrain < 0 || len(parts) == 0 {
		return
	}
	deadline := time.NewTimer(s.cfg.RevokeDrain)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		held := 0
		for _, p := range parts {
			if !p.dead {
				held += p.t.handed
			}
		}
		wake, closed := s.watchLocked(), s.closed
		s.mu.Unlock()
		if held == 0 || closed {
			return
		}
		select {
		case <-wake:
		case <-deadline.C:
			return
		}
	}
}

// killLocked forgets p: its unsettled deliveries stop counting and any later
// settle of them is ignored.
func (s *Subscriber) killLocked(p *partition) {
	if p.dead {
		return
	}
	p.dead = true
	if p.gone != nil {
		close(p.gone)
	}
	s.unsettled -= p.t.unsettled()
	if s.parts[p.topicPartition] == p {
		delete(s.parts, p.topicPartition)
	}
	s.wakeLocked()
}

// Commit commits the settled prefix of every assigned partition now. The
// subscriber also commits every CommitInterval, on revoke and on Close.
func (s *Subscriber) Commit(ctx context.Context) error {
	return s.commit(ctx, nil)
}

// commit commits every live partition's settled prefix and then forgets the
// partitions in kill (taking their commit points in the same critical
// section, so a settle that loses the race is ignored, never half-counted).
func (s *Subscriber) commit(ctx context.Context, kill []*partition) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	type point struct {
		p   *partition
		off int64
	}
	var points []point
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	s.mu.Lock()
	for _, p := range s.parts {
		if off, epoch, ok := p.t.toCommit(); ok {
			if offsets[p.topic] == nil {
				offsets[p.topic] = make(map[int32]kgo.EpochOffset)
			}
			offsets[p.topic][p.partition] = kgo.EpochOffset{Epoch: epoch, Offset: off}
			points = append(points, point{p, off})
		}
	}
	for _, p := range kill {
		s.killLocked(p)
	}
	s.mu.Unlock()
	if len(points) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CommitTimeout)
	defer cancel()
	var errs []error
	ok := make(map[topicPartition]bool, len(points))
	s.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, t := range resp.Topics {
			for _, pr := range t.Partitions {
				if err := kerr.ErrorForCode(pr.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("%s/%d: %w", t.Topic, pr.Partition, err))
					continue
				}
				ok[topicPartition{t.Topic, pr.Partition}] = true
			}
		}
	})
	s.mu.Lock()
	for _, pt := range points {
		if ok[pt.p.topicPartition] {
			pt.p.t.committedAt(pt.off)
			if s.onCommitted != nil {
				s.onCommitted(pt.p.topicPartition, pt.off)
			}
		}
	}
	s.mu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("kafkabroker: commit: %w", errors.Join(errs...))
	}
	return nil
}

func (s *Subscriber) commitLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closeCh
		cancel()
	}()
	for {
		select {
		case <-s.closeCh:
			return
		case <-t.C:
			if err := s.commit(ctx, nil); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Warn("kafkabroker: background commit failed; retrying next interval", "err", err)
			}
		}
	}
}

// Close commits the settled prefix of every partition, leaves the group and
// closes the client, within CloseTimeout. Unsettled deliveries are
// redelivered to the group's next owner of their partition; later settles
// of them are ignored. When the group is stuck in a rebalance (commits and
// the leave wait for it), Close gives up at CloseTimeout and returns an
// error; the client then finishes closing in the background, and what was
// not committed is redelivered to the next owner.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closeCh)
	if s.pollCancel != nil {
		s.pollCancel()
	}
	s.wakeLocked()
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CloseTimeout)
	defer cancel()
	s.fetchMu.Lock() // a running Fetch has returned
	s.fetchMu.Unlock()
	s.wg.Wait()
	err := s.commit(ctx, nil)
	// Leaving the group runs onRevoked, which commits again (Close's
	// commit is done: it only forgets the partitions) and waits for an
	// in-flight join or sync to end first.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		s.cl.Close()
	}()
	select {
	case <-closed:
		s.cancelClient()
		return err
	case <-ctx.Done():
	}
	// franz-go sends JoinGroup and SyncGroup on the client's context, so
	// that a leave waits for them and the last revoke can still commit.
	// Out of time: end that context, which fails them and every other
	// request, and the close finishes at once. The coordinator drops this
	// member after SessionTimeout.
	s.cfg.Logger.Warn("kafkabroker: close timed out while the group rebalances; leaving without waiting for it",
		"group", s.cfg.Group, "close_timeout", s.cfg.CloseTimeout)
	s.cancelClient()
	<-closed
	return errors.Join(err, fmt.Errorf("kafkabroker: close: leaving group %s: %w", s.cfg.Group, ctx.Err()))
}

// due is a nak'd delivery waiting for its delay.
type due struct {
	due time.Time
	p   *partition
	e   *entry
}

type dueHeap []due

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(due)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = due{}
	*h = old[:len(old)-1]
	return x
}
