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
	t.Helper()
	redistest.DropPrefix(t, c, "{"+name+"}:idem-dedup:")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Del(ctx, name, streamsbroker.DeadLetterStream(name)).Err(); err != nil {
		t.Errorf("drop stream %s: %v", name, err)
	}
}
