package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/internal/clocktest"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/memoutbox"
)

// scriptedPublisher fails what fail says (nil: publish) and records what
// it published.
type scriptedPublisher struct {
	mu   sync.Mutex
	fail func(m *broker.Message) error
	sent []string
}

func (p *scriptedPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if err := p.fail(m); err != nil {
			return err
		}
	}
	for _, m := range msgs {
		p.sent = append(p.sent, m.ID)
	}
	return nil
}

func (p *scriptedPublisher) Close() error { return nil }

func (p *scriptedPublisher) setFail(f func(m *broker.Message) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = f
}

func (p *scriptedPublisher) published() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sent)
}

type outageRig struct {
	clock  *clocktest.Manual
	ob     *memoutbox.Outbox
	pub    *scriptedPublisher
	relay  *outbox.Relay
	mu     sync.Mutex
	failed []outbox.FailedEvent
	retry  []outbox.RetryEvent
}

func newOutageRig(t *testing.T) *outageRig { return newOutageRigWith(t, nil) }

func newOutageRigWith(t *testing.T, pub broker.Publisher) *outageRig {
	t.Helper()
	g := &outageRig{clock: clocktest.New()}
	g.ob = memoutbox.New(memoutbox.Config{Clock: g.clock})
	g.pub = &scriptedPublisher{fail: func(*broker.Message) error { return nil }}
	cfg := outbox.Config{Backend: g.ob, Publisher: g.pub}
	if pub != nil {
		cfg = outbox.Config{Backend: g.ob, Publisher: pub, PublishTimeout: time.Millisecond}
	}
	r, err := outbox.New(outbox.Config{Backend: cfg.Backend, Publisher: cfg.Publisher, PublishTimeout: cfg.PublishTimeout, Clock: g.clock, Logger: slog.New(slog.DiscardHandler),
		Hooks: outbox.Hooks{
			OnFailed: func(_ context.Context, e outbox.FailedEvent) {
				g.mu.Lock()
				g.failed = append(g.failed, e)
				g.mu.Unlock()
			},
			OnRetry: func(_ context.Context, e outbox.RetryEvent) { g.mu.Lock(); g.retry = append(g.retry, e); g.mu.Unlock() },
		}})
	if err != nil {
		t.Fatal(err)
	}
	g.relay = r
	return g
}

func (g *outageRig) enqueue(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, err := g.ob.Enqueue(context.Background(), outbox.Message{ID: id, Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
}

// round moves the clock past the longest backoff (10 s + 10% jitter) and
// runs one claim-publish-settle round.
func (g *outageRig) round(t *testing.T) int {
	t.Helper()
	g.clock.Advance(12 * time.Second)
	n, err := g.relay.RunOnce(context.Background())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	return n
}

func (g *outageRig) failedIDs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var ids []string
	for _, e := range g.failed {
		ids = append(ids, e.Row.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestOutageSpendsNoAttempts: a broker outage much longer than the whole
// backoff, with the default MaxAttempts (3), fails nothing: every round in
// which the broker took no message and every failure was the broker's
// absence (unavailable, unknown outcome, timed out) reschedules its rows
// without using up their attempts. Before, every due message was marked
// failed after 3 rounds and needed an operator's RequeueFailed.
func TestOutageSpendsNoAttempts(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Unavailable", fmt.Errorf("%w: nats: no servers available", idem.ErrUnavailable)},
		{"UnknownOutcome", fmt.Errorf("%w: connection reset after write", idem.ErrUnknownOutcome)},
		{"Deadline", fmt.Errorf("publish: %w", context.DeadlineExceeded)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newOutageRig(t)
			g.enqueue(t, "a", "b", "c")
			g.pub.setFail(func(*broker.Message) error { return tc.err })
			const rounds = 10 // 3 would have failed them all
			for i := range rounds {
				if n := g.round(t); n != 3 {
					t.Fatalf("round %d claimed %d rows, want all 3 due again", i, n)
				}
			}
			if ids := g.failedIDs(); len(ids) != 0 {
				t.Fatalf("an outage failed %v", ids)
			}
			if st, err := g.ob.Stats(context.Background()); err != nil || st.Failed != 0 || st.Pending != 3 {
				t.Fatalf("after the outage: %+v, %v", st, err)
			}
			g.mu.Lock()
			last := g.retry[len(g.retry)-1]
			g.mu.Unlock()
			if last.Row.Attempts != rounds || !errors.Is(last.Err, tc.err) {
				t.Fatalf("last retry %+v: want the attempts counted (%d) and the broker's error", last, rounds)
			}
			g.pub.setFail(func(*broker.Message) error { return nil })
			g.round(t)
			got := g.pub.published()
			slices.Sort(got) // the jitter orders them
			if !slices.Equal(got, []string{"a", "b", "c"}) {
				t.Fatalf("published %v after the outage", got)
			}
			if st, err := g.ob.Stats(context.Background()); err != nil || st.Failed != 0 || st.Pending != 0 {
				t.Fatalf("after the broker came back: %+v, %v", st, err)
			}
		})
	}
}

// TestOwnFailuresCount: a message's own failures use up its attempts and
// fail it after the default 3, during the same run: a message the broker
// refuses (broker.ErrRejected, even when it also says unavailable),
// whether other messages are published beside it or the broker takes
// nothing else; a message failing, even with an outage-class error, in
// rounds in which the broker took other messages; and an error the relay
// cannot classify, alone in its round (as before).
func TestOwnFailuresCount(t *testing.T) {
	rejected := fmt.Errorf("kafka: MESSAGE_TOO_LARGE: %w", broker.ErrRejected)
	for _, tc := range []struct {
		name  string
		err   error
		other bool // others published beside it
	}{
		{"RejectedAlone", rejected, false},
		{"RejectedWithOthers", rejected, true},
		{"RejectedAlsoUnavailable", fmt.Errorf("%w: %w", idem.ErrUnavailable, broker.ErrRejected), false},
		{"UnavailableBesideAccepted", fmt.Errorf("%w: stream full", idem.ErrUnavailable), true},
		{"UnclassifiedAlone", errors.New("broker says no"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newOutageRig(t)
			g.enqueue(t, "bad")
			g.pub.setFail(func(m *broker.Message) error {
				if m.ID == "bad" {
					return tc.err
				}
				return nil
			})
			for i := range 3 {
				if tc.other {
					g.enqueue(t, fmt.Sprint("good", i))
				}
				g.round(t)
			}
			if ids := g.failedIDs(); !slices.Equal(ids, []string{"bad"}) {
				t.Fatalf("failed %v, want [bad] after 3 attempts", ids)
			}
			g.mu.Lock()
			e := g.failed[0]
			g.mu.Unlock()
			if e.Row.Attempts != 3 || !errors.Is(e.Err, tc.err) {
				t.Fatalf("failed event %+v", e)
			}
			if tc.other && len(g.pub.published()) != 3 {
				t.Fatalf("published %v", g.pub.published())
			}
		})
	}
}

// hungPublisher answers nothing until its context ends.
type hungPublisher struct{}

func (hungPublisher) Publish(ctx context.Context, _ ...*broker.Message) error {
	<-ctx.Done()
	return fmt.Errorf("%w (%w)", broker.ErrRejected, ctx.Err()) // a rejection it could not deliver in time
}
func (hungPublisher) Close() error { return nil }

// TestHungBrokerSpendsNoAttempts: a broker that answers nothing: the batch
// times out and no message is tried one by one (the relay's not-tried
// error, whatever the batch's error said): an outage, nothing fails.
func TestHungBrokerSpendsNoAttempts(t *testing.T) {
	g := newOutageRigWith(t, hungPublisher{})
	g.enqueue(t, "a", "b")
	for i := range 6 {
		if n := g.round(t); n != 2 {
			t.Fatalf("round %d claimed %d rows", i, n)
		}
	}
	if ids := g.failedIDs(); len(ids) != 0 {
		t.Fatalf("a hung broker failed %v", ids)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.retry[len(g.retry)-1]; !e.Outage || e.Row.Attempts != 6 {
		t.Fatalf("last retry %+v, want an outage retry at attempt 6", e)
	}
}
