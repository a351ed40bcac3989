package redislock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore/redislock"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a Locker on its own key prefix of a server; its keys are dropped
// in cleanup.
type env struct {
	client redis.UniversalClient
	prefix string
}

func newEnv(t *testing.T, client redis.UniversalClient) env {
	var b [6]byte
	_, _ = rand.Read(b[:])
	e := env{client: client, prefix: "idemlocktest-" + hex.EncodeToString(b[:]) + ":"}
	t.Cleanup(func() {
		ctx := context.Background()
		del := func(ctx context.Context, n redis.Cmdable) error {
			it := n.Scan(ctx, 0, e.prefix+"*", 1000).Iterator()
			for it.Next(ctx) {
				n.Del(ctx, it.Val())
			}
			return it.Err()
		}
		if cc, ok := client.(*redis.ClusterClient); ok {
			_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return del(ctx, c) })
		} else {
			_ = del(ctx, client)
		}
	})
	return e
}

func (e env) locker(t *testing.T, cfg redislock.Config) *redislock.Locker {
	cfg.Client, cfg.Prefix = e.client, e.prefix
	l, err := redislock.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

func shared(t *testing.T) env {
	c := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s unreachable: %v", redistest.SharedAddr, err)
	}
	return newEnv(t, c)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// backends runs fn against the shared single node and a 3-master cluster.
func backends(t *testing.T, fn func(t *testing.T, e env)) {
	t.Run("single", func(t *testing.T) { fn(t, shared(t)) })
	t.Run("cluster", func(t *testing.T) {
		cl := clusterOnce(t)
		fn(t, newEnv(t, cl))
	})
}

var (
	clusterMu     sync.Mutex
	clusterClient *redis.ClusterClient
)

// clusterOnce starts one cluster for the whole package run; the top-level
// test that first asks owns it (cleanup at its end), later ones start anew.
func clusterOnce(t *testing.T) *redis.ClusterClient {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// acquireEventually polls TryAcquire until the current hold lapses (no
// timing assumption beyond a generous bound).
func acquireEventually(t *testing.T, l *redislock.Locker, name string, opts ...redislock.Option) *redislock.Lock {
	t.Helper()
	for i := 0; ; i++ {
		lk, err := l.TryAcquire(context.Background(), name, opts...)
		if err == nil {
			return lk
		}
		if !errors.Is(err, redislock.ErrNotAcquired) || i > 200 {
			t.Fatalf("TryAcquire(%q) after the hold should lapse: %v", name, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func TestMutualExclusion(t *testing.T) {
	backends(t, func(t *testing.T, e env) {
		l := e.locker(t, redislock.Config{TTL: 5 * time.Second, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond})
		ctx := ctxT(t)
		const workers, rounds = 8, 25
		var inside, total atomic.Int64
		var lastFence atomic.Uint64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range rounds {
					lk, err := l.Acquire(ctx, "res")
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					if prev := lastFence.Swap(lk.Fence); lk.Fence <= prev {
						t.Errorf("fence %d after %d", lk.Fence, prev)
					}
					total.Add(1)
					time.Sleep(100 * time.Microsecond)
					inside.Add(-1)
					if err := lk.Release(ctx); err != nil {
						t.Errorf("Release: %v", err)
					}
				}
			})
		}
		wg.Wait()
		if total.Load() != workers*rounds {
			t.Fatalf("%d critical sections, want %d", total.Load(), workers*rounds)
		}
	})
}

func TestExpiryAndOwnerOnlyRelease(t *testing.T) {
	backends(t, func(t *testing.T, e env) {
		l := e.locker(t, redislock.Config{})
		ctx := ctxT(t)
		a, err := l.TryAcquire(ctx, "job", redislock.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if _, err := l.TryAcquire(ctx, "job"); !errors.Is(err, redislock.ErrNotAcquired) {
			t.Fatalf("second TryAcquire while held: %v", err)
		}
		if err := a.Extend(ctx, 50*time.Millisecond); err != nil { // now let it lapse
			t.Fatalf("Extend: %v", err)
		}
		b := acquireEventually(t, l, "job", redislock.WithTTL(time.Minute))
		if b.Fence <= a.Fence {
			t.Fatalf("fence after expiry %d <= %d", b.Fence, a.Fence)
		}
		// The stale holder can neither release nor extend the new hold.
		if err := a.Release(ctx); !errors.Is(err, redislock.ErrNotHeld) {
			t.Fatalf("stale Release: %v", err)
		}
		if err := a.Extend(ctx, time.Minute); !errors.Is(err, redislock.ErrNotHeld) {
			t.Fatalf("stale Extend: %v", err)
		}
		if _, err := l.TryAcquire(ctx, "job"); !errors.Is(err, redislock.ErrNotAcquired) {
			t.Fatalf("lock free after stale releases: %v", err)
		}
		if err := b.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := b.Release(ctx); !errors.Is(err, redislock.ErrNotHeld) {
			t.Fatalf("second Release: %v", err)
		}
		c, err := l.TryAcquire(ctx, "job")
		if err != nil || c.Fence <= b.Fence {
			t.Fatalf("TryAcquire after release: %v (fence %v)", err, c)
		}
		c.Release(ctx)

		// Same owner string (say, a host name), earlier acquisition: the
		// fence tells the holds apart.
		x1, err := l.TryAcquire(ctx, "job2", redislock.WithOwner("host-1"), redislock.WithTTL(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		x2 := acquireEventually(t, l, "job2", redislock.WithOwner("host-1"))
		if err := x1.Release(ctx); !errors.Is(err, redislock.ErrNotHeld) {
			t.Fatalf("Release by the same owner's expired hold: %v", err)
		}
		if err := x2.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

func TestReentrancy(t *testing.T) {
	e := shared(t)
	ctx := ctxT(t)
	tests := []struct {
		reentrant bool
	}{{true}, {false}}
	for _, tc := range tests {
		l := e.locker(t, redislock.Config{Reentrant: tc.reentrant})
		name := "re-" + map[bool]string{true: "on", false: "off"}[tc.reentrant]
		outer, err := l.TryAcquire(ctx, name, redislock.WithOwner("w1"))
		if err != nil {
			t.Fatalf("outer: %v", err)
		}
		inner, err := l.TryAcquire(ctx, name, redislock.WithOwner("w1"))
		if !tc.reentrant {
			if !errors.Is(err, redislock.ErrNotAcquired) {
				t.Fatalf("non-reentrant second acquisition: %v", err)
			}
			outer.Release(ctx)
			continue
		}
		if err != nil || inner.Count != 2 || inner.Fence != outer.Fence {
			t.Fatalf("inner: %+v %v", inner, err)
		}
		if _, err := l.TryAcquire(ctx, name, redislock.WithOwner("w2")); !errors.Is(err, redislock.ErrNotAcquired) {
			t.Fatalf("other owner while held twice: %v", err)
		}
		if err := inner.Release(ctx); err != nil {
			t.Fatalf("inner Release: %v", err)
		}
		if _, err := l.TryAcquire(ctx, name, redislock.WithOwner("w2")); !errors.Is(err, redislock.ErrNotAcquired) {
			t.Fatalf("other owner while held once: %v", err)
		}
		if err := outer.Release(ctx); err != nil {
			t.Fatalf("outer Release: %v", err)
		}
		w2, err := l.TryAcquire(ctx, name, redislock.WithOwner("w2"))
		if err != nil || w2.Fence <= outer.Fence {
			t.Fatalf("after full release: %+v %v", w2, err)
		}
		w2.Release(ctx)
	}
}

func TestWatchdog(t *testing.T) {
	e := shared(t)
	// TTL 1s, renewed every 333ms: a renewal would have to stall for 600ms
	// for the lock to lapse, which a busy machine still allows rarely.
	l := e.locker(t, redislock.Config{TTL: time.Second})
	ctx := ctxT(t)
	lk, err := l.TryAcquire(ctx, "wd")
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	lk.StartWatchdog(wctx)
	time.Sleep(2500 * time.Millisecond) // 2.5 TTLs: only renewals keep it
	if _, err := l.TryAcquire(ctx, "wd"); !errors.Is(err, redislock.ErrNotAcquired) {
		t.Fatalf("lock not renewed by the watchdog: %v", err)
	}
	stop() // the watchdog ends with its context; the lock then expires
	lk.StopWatchdog()
	var other *redislock.Lock
	for i := 0; ; i++ {
		other, err = l.TryAcquire(ctx, "wd")
		if err == nil {
			break
		}
		if i > 100 {
			t.Fatalf("lock did not expire after the watchdog stopped: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-lk.Lost():
		t.Fatalf("Lost closed after a clean stop: %v", lk.Err())
	default:
	}
	// A watchdog that finds the lock gone reports it.
	other.StartWatchdog(ctx)
	e.client.Del(ctx, e.prefix+"{wd}")
	select {
	case <-other.Lost():
		if !errors.Is(other.Err(), redislock.ErrNotHeld) {
			t.Fatalf("Err = %v", other.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watchdog did not notice the lock was gone")
	}
	if err := other.Release(ctx); !errors.Is(err, redislock.ErrNotHeld) {
		t.Fatalf("Release of a lost lock: %v", err)
	}
}

// TestFencingOrder checks that fences grow over acquisitions by different
// owners, through release, expiry, and the loss of the fencing counter
// (the server-time floor takes over).
func TestFencingOrder(t *testing.T) {
	backends(t, func(t *testing.T, e env) {
		l := e.locker(t, redislock.Config{})
		ctx := ctxT(t)
		var last uint64
		for i := range 20 {
			lk, err := l.Acquire(ctx, "f", redislock.WithTTL(20*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if lk.Fence <= last {
				t.Fatalf("acquisition %d: fence %d <= %d", i, lk.Fence, last)
			}
			last = lk.Fence
			switch i % 3 {
			case 0:
				lk.Release(ctx)
			case 1: // let it expire
			case 2: // lose the counter too
				lk.Release(ctx)
				e.client.Del(ctx, e.prefix+"{f}:m")
			}
		}
	})
}

func TestInvalid(t *testing.T) {
	e := shared(t)
	for _, cfg := range []redislock.Config{
		{},
		{Client: e.client, Prefix: "a{b"},
		{Client: e.client, TTL: time.Microsecond},
		{Client: e.client, RetryMin: time.Second, RetryMax: time.Millisecond},
		{Client: e.client, FenceRetention: -1},
	} {
		if _, err := redislock.New(cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v", cfg, err)
		}
	}
	l := e.locker(t, redislock.Config{})
	for _, name := range []string{"", "a{b", "}"} {
		if _, err := l.TryAcquire(context.Background(), name); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("TryAcquire(%q) = %v", name, err)
		}
	}
}
