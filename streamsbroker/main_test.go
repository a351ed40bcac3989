package streamsbroker_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Tests that stop their own servers would make go-redis log every
	// refused dial.
	redis.SetLogger(quiet{})
	if code := m.Run(); code != 0 {
		os.Exit(code)
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		os.Exit(1)
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// sharedClient connects to the shared Redis (127.0.0.1:6379) and fails the
// test when it is down.
func sharedClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		t.Fatalf("Redis at %s unreachable: %v", redistest.SharedAddr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// clusterClient starts a 3-master Redis Cluster of the test's own and
// returns a client on it.
func clusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	// Make the client's per-node clients now (each starts a goroutine
	// that lives as long as the client), so the suite's per-case leak
	// checks see only what the adapter leaves behind.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	return c
}

var seq atomic.Int64

// newStream returns a stream name unique to this run; the stream, its
// dead-letter stream and its dedup keys are deleted at cleanup (never a
// FLUSHALL: the server is shared).
func newStream(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	n := strings.NewReplacer("/", "_", " ", "_", "{", "_", "}", "_").Replace(t.Name())
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	name := fmt.Sprintf("idemtest:streams:%s:%d:%d", n, time.Now().UnixNano()%1e9, seq.Add(1))
	t.Cleanup(func() { dropStream(t, c, name) })
	return name
}

func dropStream(t testing.TB, c redis.UniversalClient, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := []string{name, streamsbroker.DeadLetterStream(name)}
	pattern := "{" + name + "}:idem-dedup:*"
	scan := func(ctx context.Context, n redis.Cmdable) error {
		var cur uint64
		for {
			ks, next, err := n.Scan(ctx, cur, pattern, 1000).Result()
			if err != nil {
				return err
			}
			// One UNLINK per page: the keys share the stream's hash tag
			// (one slot), and a round trip per key made the cleanup of a
			// 100,000-message benchmark outlast its timeout under load.
			if len(ks) > 0 {
				if err := n.Unlink(ctx, ks...).Err(); err != nil {
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
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	} else {
		err = scan(ctx, c)
	}
	for _, k := range keys {
		if e := c.Del(ctx, k).Err(); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		t.Errorf("drop stream %s: %v", name, err)
	}
}
