package streamsbroker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
)

// TestLostPublishReplyIsNotResent puts a TCP proxy between go-redis (its
// default options: MaxRetries 3) and a Redis server of the test's own, and
// loses the reply of a publish after Redis ran it. Publish must return
// idem.ErrUnknownOutcome with the script sent once (go-redis would
// otherwise re-send it on a new connection: a second entry without dedup);
// a re-publish of the same id within the dedup window must add nothing.
func TestLostPublishReplyIsNotResent(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	proxy := redistest.StartProxy(t, srv.Addr())
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { direct.Close() })
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { viaProxy.Close() })
	stream := "lost-reply"
	sent := func() int { return proxy.Count("\r\nevalsha\r\n") + proxy.Count("\r\neval\r\n") }
	for _, tc := range []struct {
		name    string
		noDedup bool
		after   int64 // entries the re-publish leaves
	}{
		{"dedup", false, 2},
		{"no dedup", true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := direct.Del(bg(t), stream).Err(); err != nil {
				t.Fatal(err)
			}
			p := newPub(t, viaProxy, func(cfg *streamsbroker.PublisherConfig) { cfg.NoDedup = tc.noDedup })
			publish(t, p, stream, "warm-up-"+tc.name) // loads the script
			before := sent()
			proxy.CutReply("lost-" + tc.name)
			err := p.Publish(bg(t), &broker.Message{ID: "lost-" + tc.name, Topic: stream})
			if proxy.Armed() {
				t.Fatal("the cut did not happen: the test proves nothing")
			}
			if !errors.Is(err, idem.ErrUnknownOutcome) {
				t.Fatalf("publish whose reply was lost: %v, want ErrUnknownOutcome", err)
			}
			if n := sent() - before; n != 1 {
				t.Fatalf("%d script commands sent for one publish (a hidden re-send)", n)
			}
			if n := xlen(t, direct, stream); n != 2 {
				t.Fatalf("%d entries after the lost reply, want 2 (it was applied once)", n)
			}
			publish(t, p, stream, "lost-"+tc.name) // the caller's own retry
			if n := xlen(t, direct, stream); n != tc.after {
				t.Fatalf("%d entries after the caller re-published, want %d", n, tc.after)
			}
		})
	}
}

// TestStartsWhileRedisDown: a publisher, a subscriber and the consumer
// runtime made while Redis is down do not fail: fetches fail with
// idem.ErrUnavailable and are retried until Redis is up, then the message
// is handled. Redis then restarts without its data (the stream and the
// group are gone): the group is created again and a new message is
// handled.
func TestStartsWhileRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	srv.Stop()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	stream := "down-at-start"
	p := newPub(t, c, nil)
	sub := &errCountSub{Subscriber: newSub(t, c, stream, "g", nil)}
	if err := p.Publish(bg(t), &broker.Message{ID: "early", Topic: stream}); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("publish while Redis is down: %v, want ErrUnavailable", err)
	}
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	guard, err := idem.NewGuard(store, idem.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer guard.Close()
	var mu sync.Mutex
	handled := map[string]int{}
	c1, err := consumer.New(consumer.Config{Subscriber: sub, Guard: guard, Logger: quietLogger(),
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			mu.Lock()
			handled[m.ID]++
			mu.Unlock()
			return nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c1.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "fetches to fail while Redis is down", func() bool { return sub.failed.Load() >= 2 })
	if err := sub.lastErr(); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("fetch while Redis is down: %v, want ErrUnavailable", err)
	}
	srv.Start()
	publish(t, p, stream, "first")
	waitFor(t, "the message published after Redis came up", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["first"] == 1
	})
	srv.Stop() // no persistence: the stream and the group are gone
	srv.Start()
	publish(t, p, stream, "second")
	waitFor(t, "a message published after Redis restarted empty", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["second"] == 1
	})
}

type errCountSub struct {
	*streamsbroker.Subscriber
	failed atomic.Int64
	mu     sync.Mutex
	last   error
}

func (s *errCountSub) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	msgs, err := s.Subscriber.Fetch(ctx, max)
	if err != nil && ctx.Err() == nil {
		s.failed.Add(1)
		s.mu.Lock()
		s.last = err
		s.mu.Unlock()
	}
	return msgs, err
}

func (s *errCountSub) lastErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
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
