package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
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
			redistest.DropPrefix(t, client, prefix+ns+":")
		})
		return s
	}
}

// features of the suite for stores on client. LeaseUnit 200ms: the machine
// running the tests is shared and busy, and a round trip that stalls for a
// whole 100ms unit would fail a timing case. CorruptRecord damages a record
// the way Redis can hold one the store did not write: alternately bytes that
// are no record and a hash (every string command on it: WRONGTYPE).
// Maintain is nil (the suite runs Purge, a no-op: Redis expires records
// itself) unless maintain is given.
func features(client redis.UniversalClient, maintain func(context.Context, idem.Store) error) storetest.Features {
	var n atomic.Int64
	return storetest.Features{Batch: true, CompleteBatch: true, ExtendBatch: true, Purge: true, List: true, Stats: true, ForceRelease: true, LeaseUnit: 200 * time.Millisecond,
		CorruptRecord: func(t testing.TB, st idem.Store, key []byte) {
			how := "string"
			if n.Add(1)%2 == 0 {
				how = "hash"
			}
			damage(t, client, st.(*redisstore.Store), string(key), how)
		},
		Maintain: maintain,
	}
}

// TestConformance runs the suite on the shared Redis. The three suites
// (this one, NoCoalesce and Cluster) run side by side, after the
// sequential tests (some stop servers of their own): every namespace is
// fresh (storetest.NewNamespace) and its keys dropped at cleanup, and the
// cluster suite has its own cluster.
func TestConformance(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	storetest.Run(t, factory(c), features(c, nil))
}

// TestConformanceNoCoalesce runs the suite with every Claim in its own
// script (the default, TestConformance, coalesces concurrent claims into
// batch scripts, which must still behave one by one).
func TestConformanceNoCoalesce(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	storetest.Run(t, factoryCfg(redisstore.Config{Client: c, NoCoalesce: true}), features(c, nil))
}

// TestConformanceCluster runs the suite on a 3-master cluster of its own.
// Its maintenance, run while other Store values claim, is what an operator
// may do to a live cluster (docs/redisstore.md): Purge, SCRIPT FLUSH on
// every master (the next script call finds NOSCRIPT and sends EVAL: nothing
// may run twice or fail) and BGREWRITEAOF.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	var flushes atomic.Int64
	maintain := func(ctx context.Context, st idem.Store) error {
		if _, err := st.(idem.Purger).Purge(ctx, 0); err != nil {
			return err
		}
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			if err := m.ScriptFlush(ctx).Err(); err != nil {
				return err
			}
			flushes.Add(1)
			if err := m.BgRewriteAOF(ctx).Err(); err != nil && !strings.Contains(err.Error(), "already in progress") {
				return err
			}
			return nil
		})
	}
	storetest.Run(t, factory(c), features(c, maintain))
	// The flushes hit claims in flight: scripts were re-sent with EVAL
	// after NOSCRIPT well beyond the first load on each master.
	var evals atomic.Int64 // ForEachMaster runs its function on every master at once
	ctx := context.Background()
	_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_eval:calls="); ok {
				n, _ := strconv.Atoi(strings.SplitN(v, ",", 2)[0])
				evals.Add(int64(n))
			}
		}
		return nil
	})
	if flushes.Load() == 0 || evals.Load() <= int64(3*len(cl.Nodes)) {
		t.Fatalf("%d SCRIPT FLUSHes, %d EVALs: the maintenance did not hit claims in flight", flushes.Load(), evals.Load())
	}
	t.Logf("%d SCRIPT FLUSHes during the suite, %d scripts re-sent with EVAL", flushes.Load(), evals.Load())
}

// TestNamespaceMethod checks that Store.Namespace gives an isolated store
// on the same client, and that closing it leaves the client usable.
func TestNamespaceMethod(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
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
