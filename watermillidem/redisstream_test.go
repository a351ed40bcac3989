package watermillidem_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/watermillidem"
	"github.com/redis/go-redis/v9"
)

// TestRedisStreamPubSub runs the middleware on a real Watermill pub/sub,
// watermill-redisstream, on the shared Redis (127.0.0.1:6379; unique
// streams, deleted at cleanup): two routers are two members of one consumer
// group, sharing the guard's store (as two processes share a Redis or SQL
// store). 300 messages, 20% published a second time (a producer's retry:
// same UUID, same payload), every 25th failing once (in whichever member
// gets it), two always failing (dead-lettered after 3 attempts). Every
// other message's effect must run exactly once, each poison message must be
// on the dead-letter stream once, and the group must end with nothing
// pending.
func TestRedisStreamPubSub(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at 127.0.0.1:6379 unreachable: %v", err)
	}
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic, dlqTopic := "idemtest:watermill:in:"+suffix, "idemtest:watermill:dlq:"+suffix
	t.Cleanup(func() {
		if err := rdb.Del(context.Background(), topic, dlqTopic).Err(); err != nil {
			t.Errorf("delete the test's streams: %v", err)
		}
	})
	logger := watermill.NopLogger{}
	// Its own client: Publisher.Close closes it.
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })

	// Runs last: redisstream's read loop sleeps 500ms after an error (its
	// client closed by Subscriber.Close) before it sees the close.
	t.Cleanup(func() { waitGone(t, "redisstream.(*Subscriber).read") })
	guard := newGuard(t, newStore(t), idem.WithMaxAttempts(3))
	const n = 300
	poison := func(i int) bool { return i == 13 || i == 213 }
	flaky := func(i int) bool { return i%25 == 7 }
	var mu sync.Mutex
	effects := map[string]int{}
	failed := map[string]bool{}
	handler := func(m *message.Message) error {
		i, _ := strconv.Atoi(string(m.Payload))
		mu.Lock()
		defer mu.Unlock()
		if poison(i) {
			return errors.New("poison")
		}
		if flaky(i) && !failed[m.UUID] {
			failed[m.UUID] = true
			return errors.New("flaky")
		}
		effects[m.UUID]++
		return nil
	}
	var dedups []*watermillidem.Deduplicator
	for member := range 2 {
		// Its own client: Subscriber.Close closes it.
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), ConsumerGroup: "g", Consumer: fmt.Sprintf("member-%d", member),
		}, logger)
		if err != nil {
			t.Fatal(err)
		}
		// After the router's close (cleanups run last first): waits for the
		// subscriber's goroutines.
		t.Cleanup(func() { sub.Close() })
		d := newDedup(t, watermillidem.Config{Guard: guard, DeadLetter: pub, DeadLetterTopic: dlqTopic})
		dedups = append(dedups, d)
		runRouter(t, sub, topic, []message.HandlerMiddleware{d.Middleware}, handler)
	}
	for i := range n {
		m := message.NewMessage(fmt.Sprintf("msg-%04d", i), []byte(strconv.Itoa(i)))
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 { // a producer's retry: the same message again
			if err := pub.Publish(topic, message.NewMessage(m.UUID, m.Payload)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "every effect and both dead letters", func() bool {
		mu.Lock()
		done := len(effects)
		mu.Unlock()
		dl, _ := rdb.XLen(context.Background(), dlqTopic).Result()
		return done == n-2 && dl == 2
	})
	waitFor(t, "the group to have nothing pending", func() bool {
		p, err := rdb.XPending(context.Background(), topic, "g").Result()
		return err == nil && p.Count == 0
	})
	mu.Lock()
	for id, k := range effects {
		if k != 1 {
			t.Errorf("%s: effect ran %d times", id, k)
		}
	}
	mu.Unlock()
	dl, err := rdb.XRange(context.Background(), dlqTopic, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total watermillidem.Stats
	for _, d := range dedups {
		st := d.Stats()
		total.Duplicates += st.Duplicates
		total.DeadLettered += st.DeadLettered
		total.Handled += st.Handled
	}
	if total.Duplicates < n/5 || total.DeadLettered != 2 || total.Handled != n-2 || len(dl) != 2 {
		t.Fatalf("stats %+v, %d dead letters", total, len(dl))
	}
	t.Logf("%d messages + %d re-publishes over two group members: each effect once, %d duplicates acked, 2 dead letters", n, n/5, total.Duplicates)
}

// waitGone waits until no goroutine has fn in its stack.
func waitGone(t testing.TB, fn string) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		buf := make([]byte, 1<<20)
		if !strings.Contains(string(buf[:runtime.Stack(buf, true)]), fn) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("a goroutine in %s outlived the test", fn)
}
