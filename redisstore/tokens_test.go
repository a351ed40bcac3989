package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/redisstore"
)

// TestTokensCounterAndClock checks both halves of the token design
// (docs/redisstore.md): the server-time floor keeps tokens growing when the
// shard counters are lost (FLUSHALL of counters, failover that lost them),
// and the counter keeps them growing when it is ahead of the clock (the
// clock stepped back).
func TestTokensCounterAndClock(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { dropPrefix(t, c, prefix) })
	s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix, Shards: 1})
	ctx := context.Background()
	seq := prefix + ":seq" // Namespace "", single node: one counter
	key := []byte("k")
	claimDelete := func() uint64 {
		t.Helper()
		cl, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Lease: time.Minute, TTL: time.Hour})
		if err != nil || cl.Outcome != idem.OutcomeAcquired {
			t.Fatalf("Claim: %v %v", cl.Outcome, err)
		}
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		return cl.Record.Token
	}
	t1 := claimDelete()
	if n, err := c.Exists(ctx, seq).Result(); err != nil || n != 1 {
		t.Fatalf("counter %q not found (layout changed?): %v %v", seq, n, err)
	}

	// Counter lost: the time floor still gives a larger token.
	c.Del(ctx, seq)
	t2 := claimDelete()
	if t2 <= t1 {
		t.Fatalf("after losing the counter: token %d <= %d", t2, t1)
	}

	// Counter far ahead of the clock (as after the clock stepped back by a
	// day): tokens continue from the counter, one by one.
	ahead := t2 + uint64(24*time.Hour/time.Microsecond)
	c.Set(ctx, seq, strconv.FormatUint(ahead, 10), 0)
	t3 := claimDelete()
	t4 := claimDelete()
	if t3 != ahead+1 || t4 != ahead+2 {
		t.Fatalf("with the counter ahead at %d: tokens %d, %d", ahead, t3, t4)
	}
}
