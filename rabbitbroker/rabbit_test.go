package rabbitbroker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/rabbitbroker"
	amqp "github.com/rabbitmq/amqp091-go"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func publish(t testing.TB, p broker.Publisher, msgs ...*broker.Message) {
	t.Helper()
	if err := p.Publish(ctxT(t, 30*time.Second), msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

func msgs(topic, prefix string, n int) []*broker.Message {
	out := make([]*broker.Message, n)
	for i := range out {
		out[i] = &broker.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Topic: topic, Payload: fmt.Appendf(nil, "p%d", i)}
	}
	return out
}

// fetchN fetches until n deliveries arrived or d passed.
func fetchN(t testing.TB, s broker.Subscriber, n int, d time.Duration) []*broker.Message {
	t.Helper()
	ctx := ctxT(t, d)
	var out []*broker.Message
	for len(out) < n {
		ms, err := s.Fetch(ctx, n-len(out))
		if err != nil {
			t.Fatalf("fetched %d of %d: %v", len(out), n, err)
		}
		out = append(out, ms...)
	}
	return out
}

// nothingFor fails if s delivers anything within d.
func nothingFor(t testing.TB, s broker.Subscriber, d time.Duration) {
	t.Helper()
	ms, err := s.Fetch(ctxT(t, d), 10)
	if len(ms) > 0 {
		t.Fatalf("delivered %s (delivery %d), want nothing", ms[0].ID, ms[0].Delivery)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch = %v, want DeadlineExceeded", err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := rabbitbroker.SubscriberConfig{Conn: rabbitbroker.Conn{URL: rabbitbroker.RabbitURL()}, Queue: "q", Topics: []string{"t"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mutate := range map[string]func(*rabbitbroker.SubscriberConfig){
		"no URL":         func(c *rabbitbroker.SubscriberConfig) { c.URL = "" },
		"bad URL":        func(c *rabbitbroker.SubscriberConfig) { c.URL = "http://x" },
		"no queue":       func(c *rabbitbroker.SubscriberConfig) { c.Queue = "" },
		"no topics":      func(c *rabbitbroker.SubscriberConfig) { c.Topics = nil },
		"limit -2":       func(c *rabbitbroker.SubscriberConfig) { c.DeliveryLimit = -2 },
		"prefetch 70000": func(c *rabbitbroker.SubscriberConfig) { c.Prefetch = 70000 },
		"term policy 7":  func(c *rabbitbroker.SubscriberConfig) { c.Term = 7 },
		"tiny bucket":    func(c *rabbitbroker.SubscriberConfig) { c.DelayBuckets = []time.Duration{time.Microsecond} },
		"recovery on":    func(c *rabbitbroker.SubscriberConfig) { c.AMQP.Recovery = &amqp.Recovery{} },
		"multiplier 0.5": func(c *rabbitbroker.SubscriberConfig) { c.Reconnect.Multiplier = 0.5 },
		"exchange type":  func(c *rabbitbroker.SubscriberConfig) { c.ExchangeType = "dirct" },
		"queue amq.":     func(c *rabbitbroker.SubscriberConfig) { c.Queue = "amq.orders" },
		"exchange amq.":  func(c *rabbitbroker.SubscriberConfig) { c.Exchange = "amq.idem" },
		"queue too long": func(c *rabbitbroker.SubscriberConfig) { c.Queue = strings.Repeat("q", 250) },
		"dlq amq.":       func(c *rabbitbroker.SubscriberConfig) { c.DeadLetterQueue = "amq.dlq" },
	} {
		c := ok
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: Validate = %v, want ErrInvalidArgument", name, err)
		}
		if _, err := rabbitbroker.NewSubscriber(c); err == nil {
			t.Errorf("%s: NewSubscriber accepted it", name)
		}
	}
	if err := (rabbitbroker.PublisherConfig{}).Validate(); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("publisher without URL: %v", err)
	}
	pub := rabbitbroker.PublisherConfig{Conn: rabbitbroker.Conn{URL: rabbitbroker.RabbitURL()}}
	for _, c := range []rabbitbroker.PublisherConfig{
		{Conn: pub.Conn, ExchangeType: "fanot"},
		{Conn: pub.Conn, Exchange: "amq.idem"},
	} {
		if err := c.Validate(); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("publisher exchange %q type %q: Validate = %v, want ErrInvalidArgument", c.Exchange, c.ExchangeType, err)
		}
	}
	// The broker's predeclared amq.* exchanges may be declared again (same
	// type), and plugin exchange types start with x-.
	for _, c := range []rabbitbroker.PublisherConfig{
		{Conn: pub.Conn, ExchangeType: "topic"},
		{Conn: pub.Conn, Exchange: "amq.topic", ExchangeType: "topic"},
		{Conn: pub.Conn, ExchangeType: "x-consistent-hash"},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("publisher exchange type %q: %v", c.ExchangeType, err)
		}
	}
}

// TestDefaultsFromConfig: the delivery limit and the redelivery window
// that follow from the defaults.
func TestRedeliveryWindowAndLimit(t *testing.T) {
	c := rabbitbroker.SubscriberConfig{Conn: rabbitbroker.Conn{URL: rabbitbroker.RabbitURL()}, Queue: "q", Topics: []string{"t"}}
	if got := c.MaxDeliveries(); got != 21 {
		t.Errorf("MaxDeliveries = %d, want 21 (x-delivery-limit 20 + the first delivery)", got)
	}
	if got, want := c.RedeliveryWindow(), 21*30*time.Minute+5*time.Minute; got != want {
		t.Errorf("RedeliveryWindow = %s, want %s", got, want)
	}
	c.Classic = true
	if c.MaxDeliveries() != 0 || c.RedeliveryWindow() < 100*365*24*time.Hour {
		t.Errorf("classic: MaxDeliveries %d, window %s; want 0 and unbounded", c.MaxDeliveries(), c.RedeliveryWindow())
	}
}

func TestPublishUnroutableAndWithoutID(t *testing.T) {
	x := newTopo(t)
	p := x.publisher(t)
	err := p.Publish(ctxT(t, 30*time.Second), &broker.Message{ID: "a", Topic: "nobody-listens"})
	if !errors.Is(err, rabbitbroker.ErrUnroutable) || !errors.Is(err, broker.ErrRejected) {
		t.Fatalf("Publish to an unbound routing key = %v, want ErrUnroutable (and broker.ErrRejected)", err)
	}
	// One unroutable message fails the batch; the others are stored.
	s := subscriber(t, x.subConfig(t, "g"))
	batch := append(msgs(x.Topic, "ok", 3), &broker.Message{ID: "lost", Topic: "nobody-listens"})
	if err := p.Publish(ctxT(t, 30*time.Second), batch...); !errors.Is(err, rabbitbroker.ErrUnroutable) || !errors.Is(err, broker.ErrRejected) || !containsAll(err.Error(), "lost", "1 of 4") {
		t.Fatalf("mixed batch: %v, want ErrUnroutable naming lost, 1 of 4", err)
	}
	for _, m := range fetchN(t, s, 3, 10*time.Second) {
		if err := m.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Publish(ctxT(t, 5*time.Second), &broker.Message{Topic: x.Topic}); !errors.Is(err, idem.ErrInvalidArgument) || !errors.Is(err, broker.ErrRejected) {
		t.Fatalf("Publish without ID = %v, want ErrInvalidArgument and broker.ErrRejected", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// TestPropertiesAndTrace: message-id property, persistence, idem headers
// and the trace context of the publishing context.
func TestPropertiesAndTrace(t *testing.T) {
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	if err := rabbitbroker.Declare(ctxT(t, 10*time.Second), cfg); err != nil {
		t.Fatal(err)
	}
	p := x.publisher(t)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := broker.ContextWithTrace(ctxT(t, 10*time.Second), broker.TraceContext{TraceParent: tp})
	if err := p.Publish(ctx, &broker.Message{ID: "m1", Topic: x.Topic, Key: []byte{0, 1, 2}, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ch := adminChannel(t)
	defer ch.Close()
	d, ok, err := ch.Get(cfg.Queue, false)
	if err != nil || !ok {
		t.Fatalf("basic.get: %v %v", ok, err)
	}
	defer d.Nack(false, true)
	if d.MessageId != "m1" || d.DeliveryMode != amqp.Persistent || d.Headers[broker.HeaderMessageID] != "m1" ||
		d.Headers[broker.HeaderTraceParent] != tp || d.Headers[rabbitbroker.HeaderKey] != "AAEC" || d.Timestamp.IsZero() {
		t.Fatalf("published message: id %q mode %d headers %v timestamp %s", d.MessageId, d.DeliveryMode, d.Headers, d.Timestamp)
	}
}

// TestDeliveryLimit: a quorum queue with x-delivery-limit 2 delivers a
// message three times (MaxDeliveries), counted in Message.Delivery, then
// dead-letters it to the dead-letter queue; it never comes back.
func TestDeliveryLimit(t *testing.T) {
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	cfg.DeliveryLimit = 2
	s := subscriber(t, cfg)
	if s.MaxDeliveries() != 3 {
		t.Fatalf("MaxDeliveries = %d, want 3", s.MaxDeliveries())
	}
	publish(t, x.publisher(t), msgs(x.Topic, "limit", 1)...)
	for want := 1; want <= 3; want++ {
		m := fetchN(t, s, 1, 10*time.Second)[0]
		if m.Delivery != want {
			t.Fatalf("delivery %d has Delivery %d", want, m.Delivery)
		}
		if err := m.Acker.Nak(ctxT(t, 5*time.Second), 0); err != nil {
			t.Fatal(err)
		}
	}
	nothingFor(t, s, time.Second)
	waitDepth(t, cfg.Queue+".dlq", 1)
}

func waitDepth(t testing.TB, q string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := queueDepth(t, q)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s has %d messages, want %d", q, n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNakDelay: Nak(1.5s) goes to the 2s delay queue and comes back after
// at least 1.5s (the bucket rounds up), with its topic, key, headers and
// payload, and a delivery count that goes on from the original's; another
// message meanwhile flows at once.
func TestNakDelay(t *testing.T) {
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	s := subscriber(t, cfg)
	p := x.publisher(t)
	sent := &broker.Message{ID: "delayed", Topic: x.Topic, Key: []byte("k"), Headers: map[string]string{"x-tenant": "acme"}, Payload: []byte("body")}
	publish(t, p, sent)
	m := fetchN(t, s, 1, 10*time.Second)[0]
	if err := m.Acker.Nak(ctxT(t, 5*time.Second), 0); err != nil { // delivery 2 next
		t.Fatal(err)
	}
	m = fetchN(t, s, 1, 10*time.Second)[0]
	if m.Delivery != 2 {
		t.Fatalf("after Nak(0): Delivery %d, want 2", m.Delivery)
	}
	nakAt := time.Now()
	if err := m.Acker.Nak(ctxT(t, 5*time.Second), 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	publish(t, p, msgs(x.Topic, "other", 1)...)
	if o := fetchN(t, s, 1, 10*time.Second)[0]; o.ID != "other-0" || time.Since(nakAt) > 1500*time.Millisecond {
		t.Logf("the other message came %s after the nak (load?)", time.Since(nakAt))
	} else if err := o.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	back := fetchN(t, s, 1, 20*time.Second)[0]
	if d := time.Since(nakAt); d < 1500*time.Millisecond {
		t.Fatalf("redelivered %s after Nak(1.5s)", d)
	}
	if back.ID != sent.ID || back.Topic != x.Topic || string(back.Key) != "k" || back.Headers["x-tenant"] != "acme" || string(back.Payload) != "body" {
		t.Fatalf("delayed copy differs: %+v", back)
	}
	if back.Delivery != 3 {
		t.Fatalf("delayed copy has Delivery %d, want 3 (two before)", back.Delivery)
	}
	if _, bad := back.Headers["idem-deliveries"]; bad {
		t.Fatal("internal header idem-deliveries leaked into Message.Headers")
	}
	if err := back.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := queueDepth(t, cfg.DelayQueue(2*time.Second)); n != 0 {
		t.Fatalf("delay queue holds %d messages", n)
	}
	nothingFor(t, s, 500*time.Millisecond)
}

// TestTermPolicies: TermDeadLetter (default) moves the message to the
// dead-letter queue; TermAck drops it (the consumer dead-lettered it). In
// both cases it never comes back.
func TestTermPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy rabbitbroker.TermPolicy
		inDLQ  int
	}{{rabbitbroker.TermDeadLetter, 1}, {rabbitbroker.TermAck, 0}} {
		t.Run(fmt.Sprint(tc.policy), func(t *testing.T) {
			x := newTopo(t)
			cfg := x.subConfig(t, "g")
			cfg.Term = tc.policy
			s := subscriber(t, cfg)
			publish(t, x.publisher(t), msgs(x.Topic, "term", 1)...)
			m := fetchN(t, s, 1, 10*time.Second)[0]
			if err := m.Acker.Term(ctxT(t, 5*time.Second), "poison"); err != nil {
				t.Fatal(err)
			}
			nothingFor(t, s, time.Second)
			waitDepth(t, cfg.Queue+".dlq", tc.inDLQ)
		})
	}
}

// TestServerClosesConnection: the broker closes the subscriber's and the
// publisher's connections (rabbitmqctl close_connection) while the
// subscriber holds 10 unacked deliveries. Their acks fail with
// ErrDeliveryLost; the subscriber reconnects and gets all 10 again
// (Delivery 2); the publisher reconnects and publishes.
func TestServerClosesConnection(t *testing.T) {
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	s := subscriber(t, cfg)
	p, pname := x.namedPublisher(t)
	sent := msgs(x.Topic, "held", 10)
	publish(t, p, sent...)
	held := fetchN(t, s, 10, 10*time.Second)
	if n := closeConnections(t, "", cfg.Name); n != 1 {
		t.Fatalf("closed %d connections named %s, want 1", n, cfg.Name)
	}
	if n := closeConnections(t, "", pname); n != 1 {
		t.Fatalf("closed %d publisher connections, want 1", n)
	}
	waitFor(t, "the subscriber's second connection", func() bool { return s.Connects() >= 2 && s.Connected() })
	for _, m := range held {
		if err := m.Acker.Ack(ctxT(t, 5*time.Second)); !errors.Is(err, rabbitbroker.ErrDeliveryLost) || !errors.Is(err, broker.ErrDeliveryLost) {
			t.Fatalf("Ack of a delivery of the closed connection = %v, want ErrDeliveryLost", err)
		}
		if err := m.Acker.InProgress(ctxT(t, 5*time.Second)); !errors.Is(err, rabbitbroker.ErrDeliveryLost) || !errors.Is(err, broker.ErrDeliveryLost) {
			t.Fatalf("InProgress of a lost delivery = %v, want ErrDeliveryLost", err)
		}
	}
	again := fetchN(t, s, 10, 20*time.Second)
	for _, m := range again {
		if m.Delivery != 2 {
			t.Errorf("%s redelivered with Delivery %d, want 2", m.ID, m.Delivery)
		}
		if err := m.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
			t.Fatalf("Ack after reconnect: %v", err)
		}
	}
	// The publisher waits for its new connection within Publish's context.
	publish(t, p, msgs(x.Topic, "after", 1)...)
	if m := fetchN(t, s, 1, 10*time.Second)[0]; m.ID != "after-0" {
		t.Fatalf("got %s, want after-0", m.ID)
	} else if err := m.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	nothingFor(t, s, 500*time.Millisecond)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTopologyRedeclared: the work queue is deleted under a running
// subscriber (the broker cancels its consumer); the subscriber reconnects,
// declares the queue and its binding again and consumes what is published
// next.
func TestTopologyRedeclared(t *testing.T) {
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	s := subscriber(t, cfg)
	ch := adminChannel(t)
	if _, err := ch.QueueDelete(cfg.Queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	// Fetch notices the cancelled consumer; the subscriber reconnects.
	fctx, stop := context.WithCancel(context.Background())
	fetched := make(chan []*broker.Message, 1)
	go func() {
		ms, _ := s.Fetch(fctx, 1)
		fetched <- ms
	}()
	waitFor(t, "a reconnection", func() bool { return s.Connects() >= 2 && s.Connected() })
	stop()
	if ms := <-fetched; len(ms) > 0 {
		t.Fatalf("fetched %s before anything was published", ms[0].ID)
	}
	p := x.publisher(t)
	publish(t, p, msgs(x.Topic, "redeclared", 1)...)
	if m := fetchN(t, s, 1, 10*time.Second)[0]; m.ID != "redeclared-0" {
		t.Fatalf("got %s", m.ID)
	}
}

// TestUnreachableAtStart: with nothing listening, NewSubscriber and
// NewPublisher succeed, WaitReady reports the dial error, Fetch and
// Publish wait within their contexts; once a listener appears (a proxy to
// the real broker on that port) both connect without being recreated.
func TestUnreachableAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	cfg.URL = "amqp://guest:guest@" + addr + "/"
	cfg.Reconnect = rabbitbroker.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}
	s, err := rabbitbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatalf("NewSubscriber with the broker unreachable: %v", err)
	}
	defer s.Close()
	pcfg := x.pubConfig()
	pcfg.URL, pcfg.Reconnect = cfg.URL, cfg.Reconnect
	p, err := rabbitbroker.NewPublisher(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = s.WaitReady(ctxT(t, 300*time.Millisecond))
	if !errors.Is(err, rabbitbroker.ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("WaitReady while unreachable = %v, want ErrNotReady, DeadlineExceeded and the dial's ErrUnavailable", err)
	}
	if s.Connected() || p.Connected() {
		t.Fatal("Connected while unreachable")
	}
	if _, err := s.Fetch(ctxT(t, 200*time.Millisecond), 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch while unreachable = %v", err)
	}
	if err := p.Publish(ctxT(t, 200*time.Millisecond), msgs(x.Topic, "early", 1)...); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("Publish while unreachable = %v, want ErrUnavailable", err)
	}
	proxy(t, addr, "127.0.0.1:5672")
	if err := s.WaitReady(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	publish(t, p, msgs(x.Topic, "late", 1)...)
	if m := fetchN(t, s, 1, 10*time.Second)[0]; m.ID != "late-0" {
		t.Fatalf("got %s", m.ID)
	}
}

// tcpProxy forwards TCP connections from a loopback port to target:
// cutting it closes every connection it carries (a network failure, as
// both ends see it) while it keeps accepting new ones; blackholing drops
// what its connections carry instead, closing nothing; while refusing, it
// closes each new connection at once.
type tcpProxy struct {
	ln       net.Listener
	target   string
	refusing atomic.Bool
	mu       sync.Mutex
	pairs    []*proxied
	wg       sync.WaitGroup
	once     sync.Once
}

// proxied is one carried connection: client c, upstream u.
type proxied struct {
	c, u    net.Conn
	holed   atomic.Bool  // drop everything both ways
	dropped atomic.Int64 // bytes from the client dropped
}

// proxy listens on listen ("127.0.0.1:0" for any port) and forwards to
// target until stopped (at cleanup at the latest).
func proxy(t testing.TB, listen, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.refusing.Load() {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			x := &proxied{c: c, u: u}
			p.mu.Lock()
			p.pairs = append(p.pairs, x)
			p.mu.Unlock()
			p.wg.Go(func() { x.pipe(u, c, &x.dropped) })
			p.wg.Go(func() { x.pipe(c, u, nil) })
		}
	})
	t.Cleanup(p.stop)
	return p
}

// pipe copies src to dst until either fails or closes, then closes dst;
// while x is blackholed it reads and drops (counted in dropped if not
// nil), as a network that loses every packet: neither end hears from
// the other, and neither sees the other close (until cut).
func (x *proxied) pipe(dst, src net.Conn, dropped *atomic.Int64) {
	defer func() {
		if !x.holed.Load() {
			dst.Close()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if x.holed.Load() {
				if dropped != nil {
					dropped.Add(int64(n))
				}
			} else if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// URL is an AMQP URL through the proxy.
func (p *tcpProxy) URL() string { return "amqp://guest:guest@" + p.ln.Addr().String() + "/" }

// cut closes every connection carried so far and returns how many.
func (p *tcpProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range p.pairs {
		x.c.Close()
		x.u.Close()
	}
	n := len(p.pairs)
	p.pairs = nil
	return n
}

// blackhole makes every connection carried so far drop what it carries
// from now on (connections accepted later are not affected) and returns
// how many.
func (p *tcpProxy) blackhole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range p.pairs {
		x.holed.Store(true)
	}
	return len(p.pairs)
}

// dropped is how many bytes from clients blackholed connections dropped.
func (p *tcpProxy) dropped() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, x := range p.pairs {
		n += x.dropped.Load()
	}
	return n
}

func (p *tcpProxy) stop() {
	p.once.Do(func() {
		p.ln.Close()
		p.cut()
		p.wg.Wait()
	})
}

// TestLag: ready messages, this subscriber's unsettled deliveries and the
// messages waiting in delay queues count; settled ones do not.
func TestLag(t *testing.T) {
	x := newTopo(t)
	s := subscriber(t, x.subConfig(t, "g"))
	lag := func() int64 {
		t.Helper()
		n, err := s.Lag(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := lag(); n != 0 {
		t.Fatalf("Lag of an empty queue = %d", n)
	}
	publish(t, x.publisher(t), msgs(x.Topic, "lag", 10)...)
	got := fetchN(t, s, 10, 10*time.Second)
	for _, m := range got[:3] {
		if err := m.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := got[3].Acker.Nak(ctxT(t, 5*time.Second), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// 6 unsettled in hand + 1 in the 30s delay queue.
	waitFor(t, "Lag 7", func() bool { return lag() == 7 })
	for _, m := range got[4:] {
		if err := m.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if n := lag(); n != 1 {
		t.Fatalf("Lag = %d, want 1 (the delayed message)", n)
	}
}

// TestClassicQueue: Classic declares classic queues (work, dead-letter,
// delay): no delivery limit (MaxDeliveries 0), Delivery from the
// redelivered flag (2) and from the delay copy's count (3), Term to the
// dead-letter queue.
func TestClassicQueue(t *testing.T) {
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	cfg.Classic = true
	s := subscriber(t, cfg)
	if s.MaxDeliveries() != 0 {
		t.Fatalf("MaxDeliveries = %d, want 0", s.MaxDeliveries())
	}
	publish(t, x.publisher(t), msgs(x.Topic, "classic", 1)...)
	for want, nak := range []time.Duration{0, time.Second, -1} {
		m := fetchN(t, s, 1, 10*time.Second)[0]
		if m.Delivery != want+1 {
			t.Fatalf("delivery %d: Delivery %d", want+1, m.Delivery)
		}
		var err error
		if nak >= 0 {
			err = m.Acker.Nak(ctxT(t, 5*time.Second), nak)
		} else {
			err = m.Acker.Term(ctxT(t, 5*time.Second), "done")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	waitDepth(t, cfg.Queue+".dlq", 1)
	types := rabbitctl(t, "list_queues", "name", "type")
	for _, q := range []string{cfg.Queue, cfg.Queue + ".dlq", cfg.DelayQueue(time.Second)} {
		if row, ok := types[q]; !ok || row[0] != "classic" {
			t.Errorf("%s is not a classic queue (%v)", q, row)
		}
	}
}

// TestDefaultsOnTheServer: what the broker itself reports for a subscriber
// and a publisher left at their defaults, i.e. the seeds' reliable
// settings applied without being asked for (docs/rabbitbroker.md,
// "Defaults and where they come from"): a quorum work queue with
// x-delivery-limit 20, a dead-letter exchange, at-least-once
// dead-lettering and reject-publish overflow; a quorum dead-letter queue;
// a consumer with manual acks and prefetch 1024; a publisher channel in
// confirm mode. (Persistent messages: TestPropertiesAndTrace.)
func TestDefaultsOnTheServer(t *testing.T) {
	x := newTopo(t)
	cfg := x.subConfig(t, "g")
	s := subscriber(t, cfg)
	p, pname := x.namedPublisher(t)
	publish(t, p, msgs(x.Topic, "d", 1)...)
	m := fetchN(t, s, 1, 10*time.Second)[0]
	defer m.Acker.Ack(ctxT(t, 5*time.Second))

	queues := rabbitctl(t, "list_queues", "name", "type", "arguments")
	want := map[string][]string{
		cfg.Queue: {"quorum", `{"x-delivery-limit",20}`, `{"x-dead-letter-exchange","` + cfg.Queue + `.dlx"}`,
			`{"x-dead-letter-strategy","at-least-once"}`, `{"x-overflow","reject-publish"}`},
		cfg.Queue + ".dlq": {"quorum"},
	}
	for q, parts := range want {
		row, ok := queues[q]
		if !ok {
			t.Errorf("queue %s not listed", q)
			continue
		}
		if row[0] != parts[0] {
			t.Errorf("queue %s: type %s, want %s", q, row[0], parts[0])
		}
		for _, a := range parts[1:] {
			if !strings.Contains(row[1], a) {
				t.Errorf("queue %s: arguments %s, want %s among them", q, row[1], a)
			}
		}
	}

	consumers := rabbitctl(t, "list_consumers", "queue_name", "ack_required", "prefetch_count")
	if row, ok := consumers[cfg.Queue]; !ok || row[0] != "true" || row[1] != "1024" {
		t.Errorf("consumer of %s: %v (ack_required, prefetch_count), want [true 1024]", cfg.Queue, row)
	}

	// The publisher's connection, by its name, and its channels' confirm
	// flag: its publish channel is in confirm mode.
	var pid string
	for id, row := range rabbitctl(t, "list_connections", "pid", "client_properties") {
		if strings.Contains(row[0], `{"connection_name","`+pname+`"}`) {
			pid = id
		}
	}
	if pid == "" {
		t.Fatalf("publisher connection %s not listed", pname)
	}
	// A connection has several channels: its rows, not rabbitctl's map.
	channels := rabbitctlRows(t, "list_channels", "connection", "confirm")
	if !slices.ContainsFunc(channels, func(r []string) bool { return r[0] == pid && r[1] == "true" }) {
		t.Errorf("no channel of the publisher's connection is in confirm mode: %q", channels)
	}
}

// namedPublisher is x.publisher with a connection name of its own, to find
// its connection in rabbitmqctl's lists; it returns the name too.
func (x topo) namedPublisher(t testing.TB) (*rabbitbroker.Publisher, string) {
	t.Helper()
	cfg := x.pubConfig()
	cfg.Name = unique(t, "idemtest-pub")
	p, err := rabbitbroker.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, cfg.Name
}

// rabbitctl runs rabbitmqctl list_<what> with the given columns and returns
// its rows keyed by the first column.
func rabbitctl(t testing.TB, cmd string, columns ...string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	for _, f := range rabbitctlRows(t, cmd, columns...) {
		rows[f[0]] = f[1:]
	}
	return rows
}

// rabbitctlRows runs rabbitmqctl list_<what> with the given columns and
// returns its rows, each with every column.
func rabbitctlRows(t testing.TB, cmd string, columns ...string) [][]string {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-q", cmd, "--no-table-headers"}, columns...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", cmd, err, out)
	}
	var rows [][]string
	for line := range strings.Lines(string(out)) {
		if f := strings.Split(strings.TrimRight(line, "\n"), "\t"); len(f) == len(columns) {
			rows = append(rows, f)
		}
	}
	return rows
}
