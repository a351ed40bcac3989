package rabbitbroker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrDeliveryLost: the delivery came on a connection (or channel) that has
// since closed. It can no longer be settled; the broker requeues every
// unacked delivery of a closed channel and delivers it again. It wraps
// broker.ErrDeliveryLost.
var ErrDeliveryLost = fmt.Errorf("rabbitbroker: delivery's channel is closed (%w)", broker.ErrDeliveryLost)

// ErrUnroutable: the broker returned a mandatory message because no queue
// is bound for its routing key; it was not stored. It wraps
// broker.ErrRejected (the outbox relay counts its attempts even while the
// broker takes nothing else).
var ErrUnroutable = fmt.Errorf("rabbitbroker: message unroutable (no queue bound for its routing key) (%w)", broker.ErrRejected)

// ErrNotReady: no connection to the broker (yet); see WaitReady.
var ErrNotReady = errors.New("rabbitbroker: not connected")

// link is one connection's life: it is dead once the connection or any
// channel the adapter uses on it closes, and is never revived (a new
// connection is a new link, so no delivery tag crosses channels).
type link struct {
	conn *amqp.Connection
	dead chan struct{}
	once sync.Once
	why  atomic.Pointer[error]
}

func newLink(c *amqp.Connection) *link {
	l := &link{conn: c, dead: make(chan struct{})}
	l.watchClose(c.NotifyClose(make(chan *amqp.Error, 1)), "connection")
	return l
}

func (l *link) watchClose(c chan *amqp.Error, what string) {
	go func() {
		e, ok := <-c
		switch {
		case ok && e != nil:
			l.kill(fmt.Errorf("%s closed by the broker: %w", what, e))
		default:
			l.kill(fmt.Errorf("%s closed", what))
		}
	}()
}

// watch makes the link die when ch closes.
func (l *link) watch(ch *amqp.Channel, what string) {
	l.watchClose(ch.NotifyClose(make(chan *amqp.Error, 1)), what)
}

func (l *link) kill(err error) {
	l.once.Do(func() {
		l.why.Store(&err)
		close(l.dead)
	})
}

func (l *link) isDead() bool {
	select {
	case <-l.dead:
		return true
	default:
		return false
	}
}

func (l *link) reason() error {
	if p := l.why.Load(); p != nil {
		return *p
	}
	return nil
}

// gone is the error of a use of a dead link: nothing was sent on it.
func (l *link) gone() error {
	return fmt.Errorf("%w: %w (%w)", idem.ErrUnavailable, ErrNotReady, l.reason())
}

// shut closes the connection (the broker requeues what it had unacked).
func (l *link) shut() {
	l.kill(errors.New("closed"))
	_ = l.conn.CloseDeadline(time.Now().Add(5 * time.Second))
}

// keeper keeps a link up: dial, set up (topology, channels), wait until
// the link dies, dial again with backoff, until closed. setup gets a new
// connection and returns the generation that lives on it.
type keeper[G any] struct {
	conn  Conn
	what  string
	setup func(*amqp.Connection) (G, *link, error)

	closeCtx context.Context
	cancel   context.CancelFunc
	done     chan struct{}

	mu       sync.Mutex
	cur      *G
	curLink  *link
	changed  chan struct{} // closed and replaced at every change of cur
	lastErr  error
	connects atomic.Int64
}

func startKeeper[G any](conn Conn, what string, setup func(*amqp.Connection) (G, *link, error)) *keeper[G] {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper[G]{conn: conn, what: what, setup: setup, closeCtx: ctx, cancel: cancel,
		done: make(chan struct{}), changed: make(chan struct{})}
	go k.run()
	return k
}

func (k *keeper[G]) run() {
	defer close(k.done)
	b := k.conn.Reconnect
	next, wait := b.Initial, time.Duration(0)
	failures := 0
	for {
		if wait > 0 {
			// Up to 20% jitter, so many clients do not reconnect in step.
			wait -= time.Duration(rand.Int64N(int64(wait)/5 + 1))
			if !sleepCtx(k.closeCtx, wait) {
				return
			}
		}
		g, l, err := k.dial()
		if err != nil {
			if k.closeCtx.Err() != nil {
				return
			}
			failures++
			k.mu.Lock()
			k.lastErr = err
			k.mu.Unlock()
			lvl := k.conn.Logger.Warn
			if failures > 1 {
				lvl = k.conn.Logger.Debug
			}
			lvl("rabbitbroker: cannot connect; retrying", "what", k.what, "name", k.conn.Name, "attempt", failures, "retry_in", next, "err", err)
			wait, next = next, min(time.Duration(float64(next)*b.Multiplier), b.Max)
			continue
		}
		if failures > 0 {
			k.conn.Logger.Info("rabbitbroker: connected", "what", k.what, "name", k.conn.Name, "after_failures", failures)
		}
		failures, next, wait = 0, b.Initial, 0
		k.connects.Add(1)
		k.set(&g, l, nil)
		select {
		case <-l.dead:
		case <-k.closeCtx.Done():
		}
		k.set(nil, nil, l.reason())
		l.shut()
		if k.closeCtx.Err() != nil {
			return
		}
		k.conn.Logger.Warn("rabbitbroker: connection lost; reconnecting", "what", k.what, "name", k.conn.Name, "err", l.reason())
		// Reconnect at once; back off from the first failure on.
	}
}

func (k *keeper[G]) set(g *G, l *link, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cur, k.curLink = g, l
	if err != nil {
		k.lastErr = err
	}
	close(k.changed)
	k.changed = make(chan struct{})
}

func (k *keeper[G]) dial() (G, *link, error) {
	var zero G
	cfg := k.conn.AMQP
	cfg.Heartbeat = k.conn.Heartbeat
	if cfg.Dial == nil {
		cfg.Dial = amqp.DefaultDial(k.conn.DialTimeout)
	}
	props := amqp.NewConnectionProperties()
	for key, v := range cfg.Properties {
		props[key] = v
	}
	props.SetClientConnectionName(k.conn.Name)
	cfg.Properties = props
	c, err := amqp.DialConfig(k.conn.URL, cfg)
	if err != nil {
		return zero, nil, fmt.Errorf("%w: rabbitbroker: dial: %w", idem.ErrUnavailable, err)
	}
	g, l, err := k.setup(c)
	if err != nil {
		_ = c.Close()
		return zero, nil, fmt.Errorf("rabbitbroker: set up %s: %w", k.what, err)
	}
	return g, l, nil
}

// current returns the live generation, waiting for one until ctx ends
// (ctx's error, with the last connection error) or the keeper closes
// (broker.ErrClosed).
func (k *keeper[G]) current(ctx context.Context) (*G, *link, error) {
	for {
		k.mu.Lock()
		g, l, changed := k.cur, k.curLink, k.changed
		k.mu.Unlock()
		if k.closeCtx.Err() != nil {
			return nil, nil, broker.ErrClosed
		}
		if g != nil && !l.isDead() {
			return g, l, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			k.mu.Lock()
			last := k.lastErr
			k.mu.Unlock()
			if last != nil {
				return nil, nil, fmt.Errorf("%w (%w; last error: %w)", ctx.Err(), ErrNotReady, last)
			}
			return nil, nil, fmt.Errorf("%w (%w)", ctx.Err(), ErrNotReady)
		case <-k.closeCtx.Done():
			return nil, nil, broker.ErrClosed
		}
	}
}

// connected reports whether a live link is up now.
func (k *keeper[G]) connected() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cur != nil && !k.curLink.isDead()
}

func (k *keeper[G]) close() {
	k.cancel()
	<-k.done
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// confirmCh is a channel in confirm mode on which every publish is
// mandatory. Publishes are serialised: the broker sends basic.return for an
// unroutable message before its basic.ack, and the returns channel is
// buffered, so once a batch's confirms are in, every return of the batch
// has been received.
type confirmCh struct {
	turn    chan struct{} // holds a token while a publish uses the channel
	ch      *amqp.Channel
	l       *link
	returns chan amqp.Return // closed by amqp091 when the channel shuts down
}

func newConfirmCh(c *amqp.Connection, l *link, what string) (*confirmCh, error) {
	ch, err := c.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	cc := &confirmCh{turn: make(chan struct{}, 1), ch: ch, l: l, returns: ch.NotifyReturn(make(chan amqp.Return, 1024))}
	l.watch(ch, what)
	return cc, nil
}

// outgoing is one message to publish.
type outgoing struct {
	exchange, key string
	pub           amqp.Publishing
}

// publish sends every message and waits for its confirm. nil: all were
// stored. An error wrapping idem.ErrUnknownOutcome: some may have been
// (connection lost, ctx ended while confirms were pending: the channel is
// then given up, so no late return or confirm is mistaken for a later
// batch's). ErrUnroutable or a broker nack: those were not stored.
//
// Waiting for its turn (another publish is using the channel) ends with
// ctx, or with ErrUnavailable once the link dies; nothing was sent then.
// Waiting for confirms ends with ctx, or once the link dies (the channel
// is given up with it): a dead connection's publishes never wait for a
// confirm that cannot come, nor for each other.
func (c *confirmCh) publish(ctx context.Context, msgs []outgoing) error {
	select {
	case c.turn <- struct{}{}:
	case <-c.l.dead:
		return c.l.gone()
	case <-ctx.Done():
		return fmt.Errorf("%w: rabbitbroker: waiting for the channel (nothing sent): %w", idem.ErrUnavailable, ctx.Err())
	}
	defer func() { <-c.turn }()
	if c.l.isDead() {
		return c.l.gone()
	}
	// Anything left from an abandoned batch was given up with its
	// channel; a live channel has nothing pending here. A closed returns
	// channel (the channel shut down) has given up every return it had
	// received: nil it, so that no receive spins on it.
	returns := c.returns
	returned := map[string]bool{}
	drain := func() {
		for returns != nil {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					return
				}
				returned[r.MessageId] = true
			default:
				return
			}
		}
	}
	dcs := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for i, m := range msgs {
		dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, m.exchange, m.key, true, false, m.pub)
		if err != nil {
			if i == 0 && ctx.Err() != nil {
				return err
			}
			c.l.kill(fmt.Errorf("publish failed: %w", err))
			return fmt.Errorf("%w: rabbitbroker: publish %s (%d of %d sent before): %w", idem.ErrUnknownOutcome, m.pub.MessageId, i, len(msgs), err)
		}
		dcs = append(dcs, dc)
		if i%256 == 255 {
			drain()
		}
	}
	var nacked []string
	for i, dc := range dcs {
	wait:
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				returned[r.MessageId] = true
			case <-dc.Done():
				break wait
			case <-c.l.dead:
				// The connection or a channel on it closed; the
				// keeper closes the connection. A confirm already
				// in still counts.
				select {
				case <-dc.Done():
					break wait
				default:
				}
				return fmt.Errorf("%w: rabbitbroker: connection lost before the confirm of %s: %w", idem.ErrUnknownOutcome, msgs[i].pub.MessageId, c.l.reason())
			case <-ctx.Done():
				c.l.kill(errors.New("publish abandoned with confirms pending"))
				return fmt.Errorf("%w: rabbitbroker: confirm of %s: %w", idem.ErrUnknownOutcome, msgs[i].pub.MessageId, ctx.Err())
			}
		}
		if !dc.Acked() {
			if c.l.isDead() || c.ch.IsClosed() {
				return fmt.Errorf("%w: rabbitbroker: channel closed before the confirm of %s: %w", idem.ErrUnknownOutcome, msgs[i].pub.MessageId, c.l.reason())
			}
			nacked = append(nacked, msgs[i].pub.MessageId)
		}
	}
	drain()
	var unroutable []string
	for _, m := range msgs {
		if returned[m.pub.MessageId] {
			unroutable = append(unroutable, fmt.Sprintf("%s (%q to %q)", m.pub.MessageId, m.key, m.exchange))
		}
	}
	switch {
	case len(unroutable) > 0:
		return fmt.Errorf("%w: %d of %d, e.g. %s", ErrUnroutable, len(unroutable), len(msgs), unroutable[0])
	case len(nacked) > 0:
		return fmt.Errorf("rabbitbroker: broker nacked %d of %d messages (not stored), e.g. %s", len(nacked), len(msgs), nacked[0])
	}
	return nil
}
