package streamsbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/internal/redisx/rediserr"
	"github.com/redis/go-redis/v9"
)

// Subscriber is one consumer of a consumer group on a stream. Fetch
// reclaims entries idle past AckWait (XAUTOCLAIM, every ClaimInterval) and
// reads new ones (XREADGROUP >); Ack is XACK; nothing is acked before the
// caller says so.
type Subscriber struct {
	cfg      SubscriberConfig
	dlq      string
	ackWait  int64 // ms
	maxDel   string
	claimMax int // XAUTOCLAIM calls per Fetch

	mu        sync.Mutex // one Redis round trip of Fetch at a time; Close's hand-back
	ready     bool       // the group is known to exist
	cursor    string     // XAUTOCLAIM's
	nextClaim time.Time
	nextTrim  time.Time

	// read-ahead: the next XREADGROUP, sent when a Fetch returns, so its
	// round trip overlaps the caller's work (readahead.go)
	ahead chan aheadResult
	buf   []*broker.Message // read ahead, not yet returned
	bufAt time.Time         // when buf was read, or its idle time last reset

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	delivered, redelivered, deadLettered, lost, trimmed, consumersDeleted, ackErrors atomic.Int64

	// the ack flusher (acks.go)
	ackMu      sync.Mutex
	ackIDs     []string
	ackStopped bool
	ackKick    chan struct{}
	ackStop    chan struct{}
	ackDone    chan struct{}
}

// NewSubscriber returns a subscriber. It does not contact Redis: the group
// is created (if missing) by the first Fetch that reaches Redis, so a
// consumer started while Redis is down keeps retrying instead of failing.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Subscriber{
		cfg:      cfg,
		dlq:      DeadLetterStream(cfg.Stream),
		ackWait:  cfg.AckWait.Milliseconds(),
		maxDel:   strconv.Itoa(max(cfg.MaxDeliver, 0)),
		claimMax: 16,
		cursor:   "0-0",
	}
	return s, nil
}

// Stats are the subscriber's counters since it was made.
type Stats struct {
	Delivered    int64 // new entries read (first deliveries)
	Redelivered  int64 // entries reclaimed after AckWait or a Nak
	DeadLettered int64 // entries moved to the dead-letter stream at MaxDeliver
	// Lost counts entries found pending but deleted from the stream
	// (XTRIM MAXLEN/MINID or XDEL by someone else) before they were acked:
	// their effect never ran here. Each one is also logged at error level.
	Lost             int64
	Trimmed          int64 // entries removed by the trim (acked by every group)
	ConsumersDeleted int64 // idle consumers without pending entries removed by the trim
	AckErrors        int64 // XACKs of queued acks that failed (retried)
}

// Stats returns the counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Delivered: s.delivered.Load(), Redelivered: s.redelivered.Load(), DeadLettered: s.deadLettered.Load(),
		Lost: s.lost.Load(), Trimmed: s.trimmed.Load(), ConsumersDeleted: s.consumersDeleted.Load(), AckErrors: s.ackErrors.Load(),
	}
}

// Consumer is this subscriber's consumer name in the group.
func (s *Subscriber) Consumer() string { return s.cfg.Consumer }

// RedeliveryWindow implements broker.Subscriber (see
// SubscriberConfig.RedeliveryWindow).
func (s *Subscriber) RedeliveryWindow() time.Duration { return s.cfg.RedeliveryWindow() }

// MaxDeliveries is MaxDeliver (0 for unlimited): an entry whose last
// delivery is left unsettled is dead-lettered by the subscriber, never
// delivered again, so the consumer runtime keeps a message on its last
// delivery instead of handing it back (broker.DeliveryLimiter).
func (s *Subscriber) MaxDeliveries() int { return max(s.cfg.MaxDeliver, 0) }

// Lag implements broker.LagReporter: the group's entries not settled yet,
// i.e. its pending entries (delivered, not acked) plus the entries it has
// not read (XINFO GROUPS lag; counted with XRANGE from its last delivered
// entry when Redis cannot tell, after an XDEL inside the range). Before the
// group exists, every entry of the stream (or none with StartAtEnd).
// Entries moved to the dead-letter stream are acked, so not counted.
func (s *Subscriber) Lag(ctx context.Context) (int64, error) {
	groups, err := s.cfg.Client.XInfoGroups(ctx, s.cfg.Stream).Result()
	if err != nil && !strings.HasPrefix(err.Error(), "ERR no such key") {
		return 0, rediserr.Map(ctx, err, "streamsbroker: lag of "+s.cfg.Stream+"/"+s.cfg.Group, false)
	}
	for _, g := range groups {
		if g.Name != s.cfg.Group {
			continue
		}
		if g.Lag >= 0 {
			return g.Pending + g.Lag, nil
		}
		unread := int64(0)
		start := "(" + g.LastDeliveredID
		for {
			page, err := s.cfg.Client.XRangeN(ctx, s.cfg.Stream, start, "+", 1000).Result()
			if err != nil {
				return 0, rediserr.Map(ctx, err, "streamsbroker: lag of "+s.cfg.Stream+"/"+s.cfg.Group, false)
			}
			unread += int64(len(page))
			if len(page) < 1000 {
				return g.Pending + unread, nil
			}
			start = "(" + page[len(page)-1].ID
		}
	}
	if s.cfg.StartAtEnd {
		return 0, nil
	}
	n, err := s.cfg.Client.XLen(ctx, s.cfg.Stream).Result()
	if err != nil {
		return 0, rediserr.Map(ctx, err, "streamsbroker: lag of "+s.cfg.Stream, false)
	}
	return n, nil
}

// Fetch returns reclaimed entries when a reclaim is due (every
// ClaimInterval), else new entries, waiting for the first one with
// blocking reads of at most PollWait each (a blocking read cannot be
// interrupted: that is how late Fetch may return after ctx ends). It returns ctx's
// error when ctx ends first, broker.ErrClosed after Close, and a Redis
// error mapped onto idem's sentinels (idem.ErrUnavailable when Redis is
// unreachable) after a failed round trip: the consumer runtime retries
// it with backoff. Concurrent calls are serialised.
func (s *Subscriber) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if max <= 0 {
		max = 1
	}
	for {
		if s.closed.Load() {
			return nil, broker.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		msgs, err := s.fetchOnce(ctx, max)
		if len(msgs) > 0 || err != nil {
			return msgs, err
		}
	}
}

// fetchOnce is one step of Fetch: ensure the group, trim if due, reclaim if
// due, else one read.
func (s *Subscriber) fetchOnce(ctx context.Context, max int) ([]*broker.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil, broker.ErrClosed
	}
	if !s.ready {
		if err := s.ensureGroup(ctx); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	if s.cfg.TrimInterval > 0 && !now.Before(s.nextTrim) {
		s.nextTrim = now.Add(s.cfg.TrimInterval)
		s.trim(ctx)
	}
	if !now.Before(s.nextClaim) {
		msgs, done, err := s.reclaim(ctx, max)
		if done {
			s.nextClaim = now.Add(s.cfg.ClaimInterval)
		}
		if err != nil || len(msgs) > 0 {
			return msgs, s.fetchErr(ctx, "reclaim", err)
		}
	}
	if msgs, ok, err := s.fromAhead(ctx, max); !ok {
		return nil, ctx.Err()
	} else if len(msgs) > 0 || err != nil {
		if len(msgs) > 0 {
			s.readAhead(max)
		}
		return msgs, s.fetchErr(ctx, "read", err)
	}
	block := min(time.Until(s.nextClaim), s.cfg.PollWait)
	if dl, ok := ctx.Deadline(); ok {
		block = min(block, time.Until(dl))
	}
	if block < time.Millisecond {
		block = -1 // XREADGROUP without BLOCK (BLOCK 0 would wait forever)
	}
	msgs, err := s.read(ctx, max, block)
	if s.closed.Load() && len(msgs) > 0 {
		// Read while Close waited for this round trip: Close hands them
		// back with the rest of this consumer's pending entries.
		return nil, broker.ErrClosed
	}
	if len(msgs) > 0 {
		s.readAhead(max)
	}
	return msgs, s.fetchErr(ctx, "read", err)
}

// fetchErr maps a round trip's error; a missing group (deleted, or a Redis
// that restarted without its data) is created again by the next step.
func (s *Subscriber) fetchErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if isNoGroup(err) {
		s.ready = false
		s.cfg.Logger.Warn("streamsbroker: consumer group missing; creating it again", "stream", s.cfg.Stream, "group", s.cfg.Group, "err", err)
		return nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return ctx.Err()
	}
	return rediserr.Map(ctx, err, "streamsbroker: "+op+" "+s.cfg.Stream+"/"+s.cfg.Group, false)
}

func isNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}

func (s *Subscriber) ensureGroup(ctx context.Context) error {
	start := "0"
	if s.cfg.StartAtEnd {
		start = "$"
	}
	err := s.cfg.Client.XGroupCreateMkStream(ctx, s.cfg.Stream, s.cfg.Group, start).Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return rediserr.Map(ctx, err, "streamsbroker: create group "+s.cfg.Group+" on "+s.cfg.Stream, false)
	}
	s.ready = true
	return nil
}

// read is one XREADGROUP > (blocking for block unless negative). A lost
// reply leaves what it delivered pending for this consumer: reclaimed after
// AckWait, like any unsettled delivery.
func (s *Subscriber) read(ctx context.Context, max int, block time.Duration) ([]*broker.Message, error) {
	res, err := s.cfg.Client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: s.cfg.Group, Consumer: s.cfg.Consumer, Streams: []string{s.cfg.Stream, ">"},
		Count: int64(max), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*broker.Message
	for _, st := range res {
		for _, xm := range st.Messages {
			fields := make([]string, 0, 2*len(xm.Values))
			for k, v := range xm.Values {
				str, _ := v.(string)
				fields = append(fields, k, str)
			}
			out = append(out, s.message(xm.ID, fields, 1))
		}
	}
	s.delivered.Add(int64(len(out)))
	return out, nil
}

func (s *Subscriber) message(id string, fields []string, delivery int) *broker.Message {
	m := decode(s.cfg.Stream, id, fields, delivery)
	m.Acker = &acker{s: s, id: id, delivery: strconv.Itoa(delivery)}
	return m
}

// reclaim runs reclaimScript from the saved cursor until the PEL has been
// scanned to its end (done) or max entries were claimed.
func (s *Subscriber) reclaim(ctx context.Context, max int) (out []*broker.Message, done bool, err error) {
	for range s.claimMax {
		res, err := reclaimScript.Run(ctx, s.cfg.Client, []string{s.cfg.Stream, s.dlq},
			s.cfg.Group, s.cfg.Consumer, s.ackWait, s.cursor, max-len(out), s.maxDel).Slice()
		if err != nil {
			return out, false, err
		}
		next, msgs, perr := s.parseReclaim(res)
		if perr != nil {
			return out, false, perr
		}
		s.cursor = next
		out = append(out, msgs...)
		if next == "0-0" {
			return out, true, nil
		}
		if len(out) >= max {
			return out, false, nil
		}
	}
	return out, false, nil
}

func (s *Subscriber) parseReclaim(res []any) (string, []*broker.Message, error) {
	bad := func() (string, []*broker.Message, error) {
		return "0-0", nil, fmt.Errorf("streamsbroker: unexpected reclaim reply %v", res)
	}
	if len(res) != 4 {
		return bad()
	}
	next, ok := res[0].(string)
	entries, ok2 := res[1].([]any)
	dead, ok3 := res[2].([]any)
	gone, ok4 := res[3].([]any)
	if !ok || !ok2 || !ok3 || !ok4 {
		return bad()
	}
	var out []*broker.Message
	for _, e := range entries {
		t, ok := e.([]any)
		if !ok || len(t) != 3 {
			return bad()
		}
		id, _ := t[0].(string)
		n, _ := t[1].(int64)
		raw, _ := t[2].([]any)
		fields := make([]string, len(raw))
		for i, f := range raw {
			fields[i], _ = f.(string)
		}
		out = append(out, s.message(id, fields, int(n)))
	}
	s.redelivered.Add(int64(len(out)))
	if len(dead) > 0 {
		s.deadLettered.Add(int64(len(dead)))
		s.cfg.Logger.Warn("streamsbroker: delivery limit reached; entries moved to the dead-letter stream",
			"stream", s.cfg.Stream, "group", s.cfg.Group, "dead_letter_stream", s.dlq, "entries", dead, "max_deliver", s.cfg.MaxDeliver)
	}
	if len(gone) > 0 {
		s.lost.Add(int64(len(gone)))
		s.cfg.Logger.Error("streamsbroker: pending entries were deleted from the stream before they were acked (trimmed with MAXLEN/MINID or XDEL outside this adapter): they are lost",
			"stream", s.cfg.Stream, "group", s.cfg.Group, "entries", gone)
	}
	return next, out, nil
}

// trim runs trimScript; failures are logged (trimming is housekeeping).
func (s *Subscriber) trim(ctx context.Context) {
	res, err := trimScript.Run(ctx, s.cfg.Client, []string{s.cfg.Stream}, ConsumerExpiry.Milliseconds()).Slice()
	if err != nil {
		if !isNoGroup(err) && ctx.Err() == nil {
			s.cfg.Logger.Warn("streamsbroker: trim failed", "stream", s.cfg.Stream, "err", err)
		}
		return
	}
	if len(res) == 3 {
		n, _ := res[0].(int64)
		d, _ := res[2].(int64)
		s.trimmed.Add(n)
		s.consumersDeleted.Add(d)
		if n > 0 || d > 0 {
			s.cfg.Logger.Debug("streamsbroker: trimmed", "stream", s.cfg.Stream, "entries", n, "minid", res[1], "consumers_deleted", d)
		}
	}
}

// Close stops fetching (a Fetch in progress returns broker.ErrClosed after
// its current round trip, at most PollWait) and hands every entry
// still pending for this consumer back to the group at once: they become
// reclaimable by the other consumers now instead of after AckWait. A
// consumer left with nothing pending is deleted from the group. Acks, naks
// and terms of deliveries already fetched still work after Close. The
// client stays open.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.stopAcks() // queued acks go out before the hand-back
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.ahead != nil {
			<-s.ahead // read ahead: pending for us, handed back below
			s.ahead = nil
		}
		if !s.ready {
			return // never reached the group: nothing was delivered
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := handBackScript.Run(ctx, s.cfg.Client, []string{s.cfg.Stream}, s.cfg.Group, s.cfg.Consumer, s.ackWait).Int64()
		if err != nil {
			s.closeErr = rediserr.Map(ctx, err, "streamsbroker: hand back pending entries of "+s.cfg.Consumer, true)
			return
		}
		if n > 0 {
			s.cfg.Logger.Debug("streamsbroker: pending entries handed back at close", "stream", s.cfg.Stream, "group", s.cfg.Group, "consumer", s.cfg.Consumer, "entries", n)
		}
	})
	return s.closeErr
}

// EntryID is the stream entry id of a delivery made by a Subscriber
// ("<ms>-<seq>"), for logs and for finding it with XRANGE or XPENDING;
// false for a message this package did not deliver (or whose Acker was
// wrapped).
func EntryID(m *broker.Message) (string, bool) {
	a, ok := m.Acker.(*acker)
	if !ok {
		return "", false
	}
	return a.id, true
}

type acker struct {
	s        *Subscriber
	id       string
	delivery string // the entry's delivery count when we got it
	settled  atomic.Bool
}

func (a *acker) settle(ctx context.Context, op string, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !a.settled.CompareAndSwap(false, true) {
		return nil
	}
	if err := f(); err != nil {
		a.settled.Store(false)
		return rediserr.Map(ctx, err, "streamsbroker: "+op+" "+a.s.cfg.Stream+" "+a.id, false)
	}
	return nil
}

// Ack is XACK: the entry leaves the group's pending list. By default it
// is queued and returns at once; the subscriber's flusher sends queued acks
// together (a lost ack is a redelivery, which the guard answers as a
// duplicate; Close sends what is queued). With AckSync (or after Close) it
// waits for Redis. XACK is idempotent, so go-redis may retry it.
func (a *acker) Ack(ctx context.Context) error {
	return a.settle(ctx, "ack", func() error {
		if !a.s.cfg.AckSync && a.s.queueAck(a.id) {
			return nil
		}
		return a.s.cfg.Client.XAck(ctx, a.s.cfg.Stream, a.s.cfg.Group, a.id).Err()
	})
}

// Nak leaves the entry pending and sets its idle time to AckWait - delay,
// so a reclaim (any consumer's) redelivers it once delay has passed (plus
// up to ClaimInterval). Delays above AckWait are cut to it. A delivery
// already reclaimed elsewhere is left alone (it is being redelivered).
func (a *acker) Nak(ctx context.Context, delay time.Duration) error {
	return a.settle(ctx, "nak", func() error {
		ms := max(delay.Milliseconds(), 0)
		if ms > a.s.ackWait {
			a.s.cfg.Logger.Debug("streamsbroker: nak delay cut to AckWait", "delay", delay, "ack_wait", a.s.cfg.AckWait)
			ms = a.s.ackWait
		}
		return a.touch(ctx, a.s.ackWait-ms).Err()
	})
}

// Term acks the entry; with DeadLetterOnTerm it is first copied to the
// dead-letter stream with reason (one script).
func (a *acker) Term(ctx context.Context, reason string) error {
	return a.settle(ctx, "term", func() error {
		if !a.s.cfg.DeadLetterOnTerm {
			return a.s.cfg.Client.XAck(ctx, a.s.cfg.Stream, a.s.cfg.Group, a.id).Err()
		}
		return termScript.Run(ctx, a.s.cfg.Client, []string{a.s.cfg.Stream, a.s.dlq}, a.s.cfg.Group, a.id, reason).Err()
	})
}

// InProgress resets the entry's idle time (XCLAIM to ourselves with JUSTID:
// the delivery count stays), so no reclaim takes it for another AckWait.
// It returns ErrDeliveryLost when the delivery is no longer ours.
func (a *acker) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if a.settled.Load() {
		return nil
	}
	ok, err := a.touch(ctx, -1).Int64()
	if err != nil {
		return rediserr.Map(ctx, err, "streamsbroker: in progress "+a.s.cfg.Stream+" "+a.id, false)
	}
	if ok == 0 && !a.settled.Load() {
		return fmt.Errorf("%w: %s %s delivery %s", ErrDeliveryLost, a.s.cfg.Stream, a.id, a.delivery)
	}
	return nil
}

func (a *acker) touch(ctx context.Context, idle int64) *redis.Cmd {
	return touchScript.Run(ctx, a.s.cfg.Client, []string{a.s.cfg.Stream}, a.s.cfg.Group, a.s.cfg.Consumer, a.id, a.delivery, idle)
}

var (
	_ broker.Subscriber      = (*Subscriber)(nil)
	_ broker.DeliveryLimiter = (*Subscriber)(nil)
	_ broker.LagReporter     = (*Subscriber)(nil)
)
