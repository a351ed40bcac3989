// Package membroker is an in-process broker implementing the broker
// interfaces with at-least-once semantics: per-group delivery, explicit
// ack, nak with delay, term, ack-wait redelivery and delivery counts. It is
// meant for tests and examples of code built on package broker and the
// consumer runtime; nothing is persisted.
package membroker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idem-dev/idem/broker"
)

// Config tunes a Broker.
type Config struct {
	// AckWait: a delivery not settled within it is redelivered. Default 30s.
	AckWait time.Duration
	// MaxDeliver bounds deliveries per message and group (0: unbounded).
	// Like JetStream, a message nak'ed or left unsettled on its last
	// delivery is silently never delivered again (see Exhausted); the
	// subscriber reports the limit through broker.DeliveryLimiter.
	MaxDeliver int
}

// Validate reports a bad configuration.
func (c Config) Validate() error {
	if c.AckWait < 0 || c.MaxDeliver < 0 {
		return fmt.Errorf("membroker: negative AckWait or MaxDeliver")
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	return c
}

// Broker holds topics in memory. The zero value is not usable; call New.
type Broker struct {
	cfg    Config
	mu     sync.Mutex
	topics map[string]*topic
}

type topic struct {
	log    []*broker.Message // published messages, never removed
	groups map[string]*group
}

type entry struct {
	idx      int // index in topic.log
	delivery int
	due      time.Time // when it may be delivered (again)
	inflight bool
	owner    *Subscriber
	gen      uint64 // bumped on each delivery: a stale acker finds its delivery lost
}

type group struct {
	next    int // next log index never delivered to this group
	entries map[int]*entry
	wake    chan struct{} // closed and replaced when something changes
}

// New returns an empty broker.
func New(cfg Config) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Broker{cfg: cfg.withDefaults(), topics: map[string]*topic{}}, nil
}

func (b *Broker) topic(name string) *topic {
	t := b.topics[name]
	if t == nil {
		t = &topic{groups: map[string]*group{}}
		b.topics[name] = t
	}
	return t
}

func (t *topic) group(name string) *group {
	g := t.groups[name]
	if g == nil {
		g = &group{entries: map[int]*entry{}, wake: make(chan struct{})}
		t.groups[name] = g
	}
	return g
}

func (g *group) signal() {
	close(g.wake)
	g.wake = make(chan struct{})
}

// Exhausted returns the ids of topic's messages that group will never
// receive again although nobody settled them: their last delivery under
// MaxDeliver was nak'ed or its ack wait expired. A consumer that loses no
// message leaves this empty.
func (b *Broker) Exhausted(topicName, groupName string) []string {
	if b.cfg.MaxDeliver <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[topicName]
	if t == nil || t.groups[groupName] == nil {
		return nil
	}
	now := time.Now()
	var idx []int
	for _, e := range t.groups[groupName].entries {
		if e.delivery >= b.cfg.MaxDeliver && (!e.inflight || !e.due.After(now)) {
			idx = append(idx, e.idx)
		}
	}
	slices.Sort(idx)
	ids := make([]string, len(idx))
	for i, x := range idx {
		ids[i] = t.log[x].ID
	}
	return ids
}

// Published returns a copy of every message published to topic, in order.
func (b *Broker) Published(topicName string) []*broker.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[topicName]
	if t == nil {
		return nil
	}
	out := make([]*broker.Message, len(t.log))
	for i, m := range t.log {
		out[i] = clone(m)
	}
	return out
}

func clone(m *broker.Message) *broker.Message {
	c := *m
	c.Headers = maps.Clone(m.Headers)
	c.Key = append([]byte(nil), m.Key...)
	c.Payload = append([]byte(nil), m.Payload...)
	c.Acker = nil
	return &c
}

// Publisher publishes into a Broker.
type Publisher struct {
	b      *Broker
	mu     sync.Mutex
	closed bool
}

// NewPublisher returns a publisher.
func (b *Broker) NewPublisher() *Publisher { return &Publisher{b: b} }

// Publish appends msgs to their topics.
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return broker.ErrClosed
	}
	for _, m := range msgs {
		if m.ID == "" || m.Topic == "" {
			return fmt.Errorf("membroker: message needs an ID and a Topic: %w", broker.ErrRejected)
		}
	}
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	now := time.Now()
	for _, m := range msgs {
		c := clone(broker.InjectTrace(ctx, m))
		c.PublishedAt = now
		t := p.b.topic(m.Topic)
		t.log = append(t.log, c)
		for _, g := range t.groups {
			g.signal()
		}
	}
	return nil
}

// Close closes the publisher.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return nil
}

// Subscriber reads one topic as one member of a group.
type Subscriber struct {
	b      *Broker
	topic  string
	group  string
	closed chan struct{}
	once   sync.Once
}

// NewSubscriber joins group on topic. A new group starts at the beginning
// of the topic.
func (b *Broker) NewSubscriber(topicName, groupName string) *Subscriber {
	b.mu.Lock()
	b.topic(topicName).group(groupName)
	b.mu.Unlock()
	return &Subscriber{b: b, topic: topicName, group: groupName, closed: make(chan struct{})}
}

// RedeliveryWindow is AckWait times MaxDeliver (AckWait when unbounded,
// since nothing bounds it better).
func (s *Subscriber) RedeliveryWindow() time.Duration {
	if s.b.cfg.MaxDeliver > 0 {
		return s.b.cfg.AckWait * time.Duration(s.b.cfg.MaxDeliver)
	}
	return s.b.cfg.AckWait
}

// MaxDeliveries is Config.MaxDeliver (broker.DeliveryLimiter).
func (s *Subscriber) MaxDeliveries() int { return s.b.cfg.MaxDeliver }

// Lag is the group's count of messages not settled yet: never delivered
// to it, or delivered and not acked or termed, leaving out those its
// delivery limit stopped (broker.LagReporter).
func (s *Subscriber) Lag(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	t := s.b.topic(s.topic)
	g := t.group(s.group)
	n := int64(len(t.log) - g.next)
	now := time.Now()
	for _, e := range g.entries {
		if s.b.cfg.MaxDeliver > 0 && e.delivery >= s.b.cfg.MaxDeliver && (!e.inflight || !e.due.After(now)) {
			continue // exhausted, as in Exhausted
		}
		n++
	}
	return n, nil
}

// Fetch returns up to max deliveries, blocking until one is ready.
func (s *Subscriber) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if max <= 0 {
		max = 1
	}
	for {
		select {
		case <-s.closed:
			return nil, broker.ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.b.mu.Lock()
		t := s.b.topic(s.topic)
		g := t.group(s.group)
		now := time.Now()
		var out []*broker.Message
		var nextDue time.Time
		var ready []*entry
		for _, e := range g.entries {
			if s.b.cfg.MaxDeliver > 0 && e.delivery >= s.b.cfg.MaxDeliver {
				continue // exhausted: never redelivered
			}
			if e.due.After(now) {
				if nextDue.IsZero() || e.due.Before(nextDue) {
					nextDue = e.due
				}
				continue
			}
			ready = append(ready, e)
		}
		// Oldest first, like a log.
		slices.SortFunc(ready, func(a, b *entry) int { return a.idx - b.idx })
		for _, e := range ready[:min(len(ready), max)] {
			out = append(out, s.deliver(t, e, now))
		}
		for len(out) < max && g.next < len(t.log) {
			e := &entry{idx: g.next}
			g.entries[g.next] = e
			g.next++
			out = append(out, s.deliver(t, e, now))
		}
		wake := g.wake
		s.b.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		wait := time.Hour
		if !nextDue.IsZero() {
			wait = time.Until(nextDue)
		}
		tm := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			tm.Stop()
			return nil, ctx.Err()
		case <-s.closed:
			tm.Stop()
			return nil, broker.ErrClosed
		case <-wake:
		case <-tm.C:
		}
		tm.Stop()
	}
}

// deliver marks e in flight for s; caller holds b.mu.
func (s *Subscriber) deliver(t *topic, e *entry, now time.Time) *broker.Message {
	e.delivery++
	e.gen++
	e.inflight = true
	e.owner = s
	e.due = now.Add(s.b.cfg.AckWait)
	m := clone(t.log[e.idx])
	m.Delivery = e.delivery
	m.Acker = &acker{s: s, idx: e.idx, gen: e.gen}
	return m
}

// Close leaves the group; this subscriber's unsettled deliveries become
// available to the group's other members at once (like a rebalance).
func (s *Subscriber) Close() error {
	s.once.Do(func() {
		close(s.closed)
		s.b.mu.Lock()
		defer s.b.mu.Unlock()
		g := s.b.topic(s.topic).group(s.group)
		now := time.Now()
		for _, e := range g.entries {
			if e.inflight && e.owner == s {
				e.inflight, e.owner, e.due = false, nil, now
			}
		}
		g.signal()
	})
	return nil
}

type acker struct {
	s    *Subscriber
	idx  int
	gen  uint64
	done bool // settled through this acker; guarded by b.mu
}

// live returns the entry if this delivery is still the live one, or nil
// when it is lost: its subscriber closed, it was delivered again after
// its ack wait, or a later delivery settled it.
func (a *acker) live(g *group) *entry {
	e := g.entries[a.idx]
	if e == nil || e.gen != a.gen || !e.inflight {
		return nil
	}
	return e
}

// settle applies f to the entry if this delivery is still the live one;
// broker.ErrDeliveryLost if it is not.
func (a *acker) settle(ctx context.Context, f func(g *group, e *entry)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := a.s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.done {
		return nil
	}
	g := b.topic(a.s.topic).group(a.s.group)
	e := a.live(g)
	if e == nil {
		return fmt.Errorf("membroker: %s/%s message %d: %w", a.s.topic, a.s.group, a.idx, broker.ErrDeliveryLost)
	}
	a.done = true
	f(g, e)
	g.signal()
	return nil
}

func (a *acker) Ack(ctx context.Context) error {
	return a.settle(ctx, func(g *group, e *entry) { delete(g.entries, e.idx) })
}

func (a *acker) Nak(ctx context.Context, delay time.Duration) error {
	return a.settle(ctx, func(g *group, e *entry) {
		e.inflight, e.owner, e.due = false, nil, time.Now().Add(delay)
	})
}

func (a *acker) Term(ctx context.Context, reason string) error {
	return a.settle(ctx, func(g *group, e *entry) { delete(g.entries, e.idx) })
}

func (a *acker) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := a.s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.done {
		return nil
	}
	e := a.live(b.topic(a.s.topic).group(a.s.group))
	if e == nil {
		return fmt.Errorf("membroker: %s/%s message %d: %w", a.s.topic, a.s.group, a.idx, broker.ErrDeliveryLost)
	}
	e.due = time.Now().Add(b.cfg.AckWait)
	return nil
}

var (
	_ broker.Publisher       = (*Publisher)(nil)
	_ broker.Subscriber      = (*Subscriber)(nil)
	_ broker.DeliveryLimiter = (*Subscriber)(nil)
)
