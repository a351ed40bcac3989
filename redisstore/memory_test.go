package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

func usedMemory(t *testing.T, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory")
	return 0
}

// TestMemoryPerRecord measures what a record costs on a dedicated server
// (figures in docs/redisstore.md; run with -v to see them) and fails if an
// in-progress record with a 16-byte key grows past 256 bytes.
func TestMemoryPerRecord(t *testing.T) {
	srv := redistest.StartServer(t)
	c := ownClient(t, srv.Addr())
	s := mustNew(t, redisstore.Config{Client: c, Namespace: "orders"})
	ctx := context.Background()
	const n = 20000
	before := usedMemory(t, c)
	var reqs []idem.ClaimRequest
	for i := range n {
		reqs = append(reqs, idem.ClaimRequest{Key: fmt.Appendf(nil, "order-%010d", i), Lease: time.Minute, TTL: time.Hour})
		if len(reqs) == 500 || i == n-1 {
			if _, err := s.ClaimBatch(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			reqs = reqs[:0]
		}
	}
	after := usedMemory(t, c)
	per := float64(after-before) / n
	usage := func(key string) int64 {
		// The layout is pinned by TestKeyLayout; find the key by SCAN.
		keys, _, err := c.Scan(ctx, 0, "idem:orders:{*}:k:"+key, 100000).Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("scan for %s: %v %v", key, keys, err)
		}
		u, err := c.MemoryUsage(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	inProg := usage("order-0000000007")
	// A completed record with a 32-byte fingerprint and a 100-byte result.
	fp := []byte(strings.Repeat("f", 32))
	cl, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("order-done-00001"), Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, []byte("order-done-00001"), cl.Record.Token, []byte(strings.Repeat("r", 100))); err != nil {
		t.Fatal(err)
	}
	done := usage("order-done-00001")
	seqs, err := c.Keys(ctx, "idem:orders:seq").Result()
	if err != nil {
		t.Fatal(err)
	}
	seqUsage, _ := c.MemoryUsage(ctx, seqs[0]).Result()
	t.Logf("%d in-progress records, 16-byte keys: used_memory grew %.0f bytes per record (includes %d token counters)", n, per, len(seqs))
	t.Logf("MEMORY USAGE: in-progress record %d bytes; completed record (32-byte fp, 100-byte result) %d bytes; token counter %d bytes",
		inProg, done, seqUsage)
	if inProg > 256 {
		t.Fatalf("in-progress record takes %d bytes, more than 256", inProg)
	}
}
