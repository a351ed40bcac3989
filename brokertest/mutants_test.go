package brokertest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/brokertest"
)

// mutants maps each deliberately broken adapter (the in-memory broker with
// one fault) to the suite cases that must fail on it. Together they cover
// every case: no case passes an adapter that does nothing for it.
var mutants = map[string][]string{
	"loses-messages":       {"PublishConsume", "ConcurrentPublishers"},
	"ack-noop":             {"PublishConsume", "NoAckBeforeEffect"},
	"redelivers-acked":     {"PublishConsume"},
	"drops-headers":        {"HeadersAndKeyRoundTrip"},
	"drops-key":            {"HeadersAndKeyRoundTrip"},
	"fills-empty-payload":  {"EmptyPayload"},
	"truncates-payload":    {"LargePayload"},
	"racy-publisher":       {"ConcurrentPublishers"},
	"fetch-returns-early":  {"FetchBlocksUntilContextDone"},
	"fetch-after-close":    {"ClosedSubscriber"},
	"settle-twice-errors":  {"SettleTwice"},
	"no-redelivery-window": {"RedeliveryWindow"},
	"nak-acks":             {"RedeliveryAfterNak"},
	"no-delivery-count":    {"RedeliveryAfterNak", "RedeliveryAfterConsumerDeath"},
	"nak-ignores-delay":    {"NakDelayHonoured"},
	"term-noop":            {"TermNotRedelivered"},
	"term-redelivers":      {"TermNotRedelivered"},
	"inprogress-noop":      {"InProgress"},
	"close-acks-unsettled": {"RedeliveryAfterConsumerDeath", "NoAckBeforeEffect", "DeliveryLostAfterClose"},
	"lost-unreported":      {"DeliveryLostAfterClose"},
	"reorders":             {"OrderedByKey"},
	"no-split":             {"ConsumerGroupSplitsWork"},
	"one-group":            {"SeparateGroupsEachGetAll"},
}

const mutantEnv = "BROKERTEST_MUTANT"

// TestMutantChild runs the suite against one mutant; only in a child
// process started by TestSuiteCatchesMutants.
func TestMutantChild(t *testing.T) {
	kind := os.Getenv(mutantEnv)
	if kind == "" {
		t.Skip("runs only as a child of TestSuiteCatchesMutants")
	}
	b, err := membroker.New(membroker.Config{AckWait: memAckWait})
	if err != nil {
		t.Fatal(err)
	}
	var subs atomic.Int64
	brokertest.Run(t, func(t testing.TB) brokertest.Env {
		topic := fmt.Sprintf("topic-%d", n.Add(1))
		return brokertest.Env{
			Topic: topic,
			NewPublisher: func(testing.TB) broker.Publisher {
				return &mutPub{Publisher: b.NewPublisher(), kind: kind}
			},
			NewSubscriber: func(_ testing.TB, group string) broker.Subscriber {
				switch kind {
				case "no-split": // every member is a group of its own
					group = fmt.Sprintf("%s-%d", group, subs.Add(1))
				case "one-group": // every group is the same one
					group = "g"
				}
				return &mutSub{Subscriber: b.NewSubscriber(topic, group), kind: kind, closed: make(chan struct{})}
			},
		}
	}, mutantFeatures)
}

// mutantFeatures: the in-memory broker delivers at once, so a message that
// has not come within a few seconds is lost; failing cases end sooner.
var mutantFeatures = func() brokertest.Features {
	f := memFeatures
	f.DeliveryTimeout = 3 * time.Second
	return f
}()

// TestSuiteCatchesMutants proves the suite can fail: for each broken
// adapter, the cases that test what it breaks must fail.
func TestSuiteCatchesMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("child")
	}
	// The children mostly wait (ack waits, redelivery timeouts until a
	// case gives up): six run at a time, not go test's -parallel
	// (GOMAXPROCS: two on CI's machine, where they took ~40 s).
	type result struct {
		out []byte
		err error
	}
	kinds := slices.Sorted(maps.Keys(mutants))
	results := make(map[string]chan result, len(kinds))
	slots := make(chan struct{}, 6)
	for _, kind := range kinds {
		done := make(chan result, 1)
		results[kind] = done // written here only: the goroutines use done
		go func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			run := fmt.Sprintf("^TestMutantChild$/^(%s)$", strings.Join(mutants[kind], "|"))
			cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+kind)
			out, err := cmd.CombinedOutput()
			done <- result{out, err}
		}()
	}
	for _, kind := range kinds {
		cases := mutants[kind]
		t.Run(kind, func(t *testing.T) {
			r := <-results[kind]
			out, err := r.out, r.err
			if err == nil {
				t.Fatalf("the suite passed a broken adapter (%s):\n%s", kind, out)
			}
			for _, c := range cases {
				if !bytes.Contains(out, []byte("--- FAIL: TestMutantChild/"+c+" ")) {
					t.Errorf("case %s did not fail on %s:\n%s", c, kind, out)
				}
			}
		})
	}
}

// mutPub is a publisher with one fault.
type mutPub struct {
	broker.Publisher
	kind     string
	inflight atomic.Int32
}

func (p *mutPub) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if p.kind == "racy-publisher" {
		// Not safe for concurrent use: a call overlapping another is
		// silently dropped.
		if p.inflight.Add(1) > 1 {
			p.inflight.Add(-1)
			return nil
		}
		defer p.inflight.Add(-1)
		time.Sleep(2 * time.Millisecond)
	}
	return p.Publisher.Publish(ctx, msgs...)
}

// mutSub is a subscriber with one fault.
type mutSub struct {
	broker.Subscriber
	kind string

	mu        sync.Mutex
	n         int
	acked     []*broker.Message // redelivers-acked: copies to hand out again
	unsettled map[*mutAcker]bool
	closed    chan struct{}
	closeOnce sync.Once
}

func (s *mutSub) RedeliveryWindow() time.Duration {
	if s.kind == "no-redelivery-window" {
		return 0
	}
	return s.Subscriber.RedeliveryWindow()
}

func (s *mutSub) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	if s.kind == "close-acks-unsettled" {
		s.mu.Lock()
		for a := range s.unsettled {
			_ = a.Acker.Ack(context.Background())
		}
		s.mu.Unlock()
	}
	return s.Subscriber.Close()
}

func (s *mutSub) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	switch s.kind {
	case "fetch-after-close":
		select {
		case <-s.closed:
			<-ctx.Done()
			return nil, ctx.Err()
		default:
		}
	case "fetch-returns-early":
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		msgs, err := s.Subscriber.Fetch(short, max)
		if err != nil && ctx.Err() == nil {
			return nil, nil
		}
		return s.mutate(msgs), err
	case "redelivers-acked":
		s.mu.Lock()
		again := s.acked
		s.acked = nil
		s.mu.Unlock()
		if len(again) > 0 {
			return again, nil
		}
	}
	msgs, err := s.Subscriber.Fetch(ctx, max)
	return s.mutate(msgs), err
}

func (s *mutSub) mutate(msgs []*broker.Message) []*broker.Message {
	var out []*broker.Message
	for _, m := range msgs {
		s.mu.Lock()
		s.n++
		lose := s.kind == "loses-messages" && s.n%7 == 0
		s.mu.Unlock()
		if lose {
			_ = m.Acker.Ack(context.Background())
			continue
		}
		switch s.kind {
		case "drops-headers":
			m.Headers = nil
		case "drops-key":
			m.Key = nil
		case "fills-empty-payload":
			if len(m.Payload) == 0 {
				m.Payload = []byte("null")
			}
		case "truncates-payload":
			if len(m.Payload) > 64<<10 {
				m.Payload = m.Payload[:64<<10]
			}
		case "no-delivery-count":
			m.Delivery = 1
		}
		a := &mutAcker{Acker: m.Acker, s: s, m: m}
		m.Acker = a
		s.mu.Lock()
		if s.unsettled == nil {
			s.unsettled = map[*mutAcker]bool{}
		}
		s.unsettled[a] = true
		s.mu.Unlock()
		out = append(out, m)
	}
	if s.kind == "reorders" {
		slices.Reverse(out)
	}
	return out
}

type mutAcker struct {
	broker.Acker
	s       *mutSub
	m       *broker.Message
	settled atomic.Bool
}

func (a *mutAcker) done() {
	a.s.mu.Lock()
	delete(a.s.unsettled, a)
	a.s.mu.Unlock()
}

// unreported is err, except that lost-unreported answers nil for a lost
// delivery.
func (a *mutAcker) unreported(err error) error {
	if a.s.kind == "lost-unreported" && errors.Is(err, broker.ErrDeliveryLost) {
		return nil
	}
	return err
}

func (a *mutAcker) Ack(ctx context.Context) error {
	if a.s.kind == "settle-twice-errors" && a.settled.Swap(true) {
		return fmt.Errorf("already settled")
	}
	a.done()
	switch a.s.kind {
	case "ack-noop":
		return nil
	case "lost-unreported":
		return a.unreported(a.Acker.Ack(ctx))
	case "redelivers-acked":
		if a.m.Delivery == 1 {
			c := *a.m
			c.Delivery = 2
			c.Acker = &mutAcker{Acker: nopAcker{}, s: a.s, m: &c}
			a.s.mu.Lock()
			a.s.acked = append(a.s.acked, &c)
			a.s.mu.Unlock()
		}
	}
	return a.Acker.Ack(ctx)
}

func (a *mutAcker) Nak(ctx context.Context, d time.Duration) error {
	if a.s.kind == "settle-twice-errors" && a.settled.Swap(true) {
		return fmt.Errorf("already settled")
	}
	a.done()
	switch a.s.kind {
	case "nak-acks":
		return a.Acker.Ack(ctx)
	case "nak-ignores-delay":
		d = 0
	case "lost-unreported":
		return a.unreported(a.Acker.Nak(ctx, d))
	}
	return a.Acker.Nak(ctx, d)
}

func (a *mutAcker) Term(ctx context.Context, reason string) error {
	if a.s.kind == "settle-twice-errors" && a.settled.Swap(true) {
		return fmt.Errorf("already settled")
	}
	a.done()
	switch a.s.kind {
	case "term-noop":
		return nil
	case "term-redelivers":
		return a.Acker.Nak(ctx, 0)
	case "lost-unreported":
		return a.unreported(a.Acker.Term(ctx, reason))
	}
	return a.Acker.Term(ctx, reason)
}

func (a *mutAcker) InProgress(ctx context.Context) error {
	if a.s.kind == "inprogress-noop" {
		return nil
	}
	return a.unreported(a.Acker.InProgress(ctx))
}

type nopAcker struct{}

func (nopAcker) Ack(context.Context) error                { return nil }
func (nopAcker) Nak(context.Context, time.Duration) error { return nil }
func (nopAcker) Term(context.Context, string) error       { return nil }
func (nopAcker) InProgress(context.Context) error         { return nil }
