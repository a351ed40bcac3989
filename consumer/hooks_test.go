package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/faultstore"
)

// hookLog records hook events as "kind:msg-id[:detail]".
type hookLog struct {
	mu     sync.Mutex
	events []string
}

func (l *hookLog) add(s string) {
	l.mu.Lock()
	l.events = append(l.events, s)
	l.mu.Unlock()
}

func (l *hookLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e == s {
			return true
		}
	}
	return false
}

func (l *hookLog) hooks() consumer.Hooks {
	return consumer.Hooks{
		OnAck: func(ctx context.Context, e consumer.AckEvent) {
			l.add(fmt.Sprintf("ack:%s:%v", e.Msg.ID, e.Duplicate))
		},
		OnNak: func(ctx context.Context, e consumer.NakEvent) { l.add("nak:" + e.Msg.ID + ":" + e.Reason) },
		OnHold: func(ctx context.Context, e consumer.HoldEvent) {
			l.add(fmt.Sprintf("hold:%s:%s:%d", e.Msg.ID, e.Reason, e.Retry))
		},
		OnDeadLetter: func(ctx context.Context, e consumer.DeadLetterEvent) {
			l.add(fmt.Sprintf("dead-letter:%s:%s:%v", e.Msg.ID, e.Topic, e.Err != nil))
		},
		OnUnrecorded: func(ctx context.Context, e consumer.UnrecordedEvent) { l.add("unrecorded:" + e.Msg.ID) },
	}
}

// TestHooksObserveSettles: every way a delivery ends (or is held) reaches
// the consumer's hooks, which is what a metrics module counts.
func TestHooksObserveSettles(t *testing.T) {
	oe := newOutageEnv(t)
	e := oe.env
	var hl hookLog
	cfg := e.config(e.sub("g"))
	cfg.Hooks = hl.hooks()
	cfg.DeadLetter = e.b.NewPublisher()
	var mu sync.Mutex
	runs := map[string]int{}
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		mu.Lock()
		runs[m.ID]++
		n := runs[m.ID]
		mu.Unlock()
		switch {
		case m.ID == "poison":
			return nil, idem.Permanent(errBoom)
		case m.ID == "flaky" && n <= 3: // the first try and its 2 in-process retries
			return nil, errBoom
		}
		return nil, nil
	}
	cfg.MaxAttempts = 2
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	oe.fs.Inject(faultstore.OpClaim, faultstore.Fault{Times: 1})
	e.publish(msg("held", "x"))
	waitFor(t, "held acked", func() bool { return e.log.Acks("held") == 1 })
	oe.fs.Inject(faultstore.OpComplete, faultstore.Fault{})
	e.publish(msg("unrec", "x"))
	waitFor(t, "unrec acked", func() bool { return e.log.Acks("unrec") == 1 })
	oe.fs.Clear()
	e.publish(msg("ok", "x"), msg("poison", "x"), msg("flaky", "x"))
	waitFor(t, "ok, poison and flaky", func() bool {
		return e.log.Acks("ok") == 1 && e.log.Terms("poison") == 1 && e.log.Acks("flaky") == 1
	})
	e.publish(msg("ok", "x"))
	waitFor(t, "the duplicate", func() bool { return e.log.Acks("ok") == 2 })
	stop()
	for _, want := range []string{
		"hold:held:store_unavailable:0", "ack:held:false",
		"ack:unrec:false", "unrecorded:unrec",
		"ack:ok:false", "ack:ok:true",
		"dead-letter:poison:orders.dead-letter:false",
		"nak:flaky:handler failed", "ack:flaky:false",
	} {
		if !hl.has(want) {
			t.Errorf("no hook event %q in %v", want, hl.events)
		}
	}
	st := c.Stats()
	if st.Holds != 1 || st.HeldNow != 0 || st.DeadLettered != 1 || st.Unrecorded != 1 || st.Duplicates != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestStatsInFlight: Stats.InFlight counts fetched deliveries not settled
// yet (handlers blocked on a gate, the rest waiting for a worker) and
// returns to zero once they are acked.
func TestStatsInFlight(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 2
	gate := make(chan struct{})
	cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) {
		<-gate
		return nil, nil
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.publish(msg("m0", "a"), msg("m1", "b"), msg("m2", "c"), msg("m3", "d"))
	stop := run(t, c)
	waitFor(t, "4 deliveries in flight", func() bool { return c.Stats().InFlight == 4 })
	close(gate)
	waitFor(t, "all acked", func() bool { return c.Stats().Handled == 4 })
	waitFor(t, "nothing in flight", func() bool { return c.Stats().InFlight == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
