package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore/redislock"
	"github.com/redis/go-redis/v9"
)

// TestLostReplyIsUnknownOutcome loses the reply of a lock script after
// Redis ran it (a TCP proxy cuts the connection), with go-redis on its
// default options. The call must return ErrUnknownOutcome and the script
// must have been sent once. Before the fix go-redis re-sent it: a lost
// acquire came back ErrNotAcquired although the caller held the lock
// (nobody could release it until its TTL), and a lost release of a
// reentrant lock held twice ran twice and freed the lock under its second
// holder.
func TestLostReplyIsUnknownOutcome(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := redistest.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr()}) // go-redis defaults
	t.Cleanup(func() { c.Close() })
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { direct.Close() })
	ctx := ctxT(t)
	l, err := redislock.New(redislock.Config{Client: c, Prefix: "lk:", Reentrant: true, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	scripts := func() int { return proxy.Count("\r\nevalsha\r\n") + proxy.Count("\r\neval\r\n") }
	cut := func(t *testing.T, call func() error) error {
		t.Helper()
		before := scripts()
		proxy.CutReply("\r\nevalsha\r\n")
		err := call()
		if proxy.Armed() {
			t.Fatal("the cut did not happen: the test proves nothing")
		}
		if n := scripts() - before; n != 1 {
			t.Fatalf("%d script commands sent, want 1 (a hidden retry); the call returned %v", n, err)
		}
		if !errors.Is(err, idem.ErrUnknownOutcome) {
			t.Fatalf("call whose reply was lost: %v, want ErrUnknownOutcome", err)
		}
		return err
	}
	// Load the scripts through the proxy first, so each call is one EVALSHA.
	warm, err := l.TryAcquire(ctx, "warm", redislock.WithOwner("w"))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Extend(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("TryAcquire", func(t *testing.T) {
		cut(t, func() error {
			_, err := l.TryAcquire(ctx, "a", redislock.WithOwner("me"))
			return err
		})
		if v, err := direct.Get(ctx, "lk:{a}").Result(); err != nil || v != "me" {
			t.Fatalf("lock a: %q %v, want held by me (the script ran)", v, err)
		}
	})
	t.Run("ReentrantRelease", func(t *testing.T) {
		first, err := l.TryAcquire(ctx, "b", redislock.WithOwner("me"))
		if err != nil {
			t.Fatal(err)
		}
		second, err := l.TryAcquire(ctx, "b", redislock.WithOwner("me"))
		if err != nil || second.Count != 2 {
			t.Fatalf("second hold: %v %v", second, err)
		}
		cut(t, func() error { return first.Release(ctx) })
		n, err := direct.HGet(ctx, "lk:{b}:m", "n").Int()
		if err != nil || n != 1 {
			t.Fatalf("hold count after one release: %d %v, want 1 (the release ran twice)", n, err)
		}
		if v, _ := direct.Get(ctx, "lk:{b}").Result(); v != "me" {
			t.Fatalf("lock b is %q after one of two releases, want still held", v)
		}
		if err := second.Release(ctx); err != nil {
			t.Fatalf("second release: %v", err)
		}
	})
}
