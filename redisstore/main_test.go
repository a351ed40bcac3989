package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/redisstore"
	"github.com/idem-dev/idem/redisstore/internal/redistest"
	"github.com/idem-dev/idem/storetest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The fail-closed tests stop servers on purpose; go-redis would log
	// every refused dial.
	redis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// uniquePrefix makes the keys of one test distinct from every other run on
// the shared server.
func uniquePrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest-" + hex.EncodeToString(b[:]) + ":"
}

// sharedClient connects to the shared Redis and fails when it is down.
func sharedClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr, MaxRetries: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		t.Fatalf("Redis at %s unreachable: %v", redistest.SharedAddr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dropPrefix deletes every key starting with prefix (on every master).
func dropPrefix(t testing.TB, c redis.UniversalClient, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One pipelined round trip per SCAN page: benchmarks leave hundreds of
	// thousands of keys (UNLINK with many keys would be CROSSSLOT on a cluster).
	del := func(ctx context.Context, n redis.Cmdable) error {
		var cur uint64
		for {
			keys, next, err := n.Scan(ctx, cur, prefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				pipe := n.Pipeline()
				for _, k := range keys {
					pipe.Unlink(ctx, k)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cur = next
		}
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
	} else {
		err = del(ctx, c)
	}
	if err != nil {
		t.Errorf("cleanup of %s*: %v", prefix, err)
	}
}

// factory builds stores on client with a prefix of their own, all sharing
// the backend, and drops their keys in cleanup.
func factory(client redis.UniversalClient) storetest.Factory {
	return factoryCfg(redisstore.Config{Client: client})
}

func factoryCfg(base redisstore.Config) storetest.Factory {
	client := base.Client
	return func(t testing.TB, ns string) idem.Store {
		prefix := "idemtest-conf:"
		cfg := base
		cfg.Namespace, cfg.Prefix = ns, prefix
		s, err := redisstore.New(context.Background(), cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() {
			s.Close()
			dropPrefix(t, client, prefix+ns+":")
		})
		return s
	}
}

// LeaseUnit 200ms: the machine running the tests is shared and busy, and a
// round trip that stalls for a whole 100ms unit would fail a timing case.
var features = storetest.Features{Batch: true, CompleteBatch: true, Purge: true, List: true, Stats: true, LeaseUnit: 200 * time.Millisecond}

func TestConformance(t *testing.T) {
	storetest.Run(t, factory(sharedClient(t)), features)
}

// TestConformanceNoCoalesce runs the suite with every Claim in its own
// script (the default, TestConformance, coalesces concurrent claims into
// batch scripts, which must still behave one by one).
func TestConformanceNoCoalesce(t *testing.T) {
	storetest.Run(t, factoryCfg(redisstore.Config{Client: sharedClient(t), NoCoalesce: true}), features)
}

func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, factory(c), features)
}

// TestNamespaceMethod checks that Store.Namespace gives an isolated store
// on the same client, and that closing it leaves the client usable.
func TestNamespaceMethod(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { dropPrefix(t, c, prefix) })
	a := mustNew(t, redisstore.Config{Client: c, Prefix: prefix, Namespace: "a"})
	b, err := a.Namespace("b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Namespace("no:colons"); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("Namespace with a colon: %v", err)
	}
	ctx := context.Background()
	ca, err := a.Claim(ctx, claimReq("same"))
	if err != nil || ca.Outcome != idem.OutcomeAcquired {
		t.Fatalf("a: %v %v", ca.Outcome, err)
	}
	cb, err := b.Claim(ctx, claimReq("same"))
	if err != nil || cb.Outcome != idem.OutcomeAcquired {
		t.Fatalf("b: %v %v", cb.Outcome, err)
	}
	b.Close()
	if err := a.Complete(ctx, []byte("same"), ca.Record.Token, nil); err != nil {
		t.Fatalf("a after closing b: %v", err)
	}
}
