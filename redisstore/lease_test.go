package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// serverMicros is the server's clock (TIME) in µs.
func serverMicros(t testing.TB, c redis.UniversalClient) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// TestLeaseNeverShorterThanAsked: with a lease of 1.999 ms (and a TTL that
// is not whole milliseconds either), the lease a claim, a takeover, a batch
// claim or an Extend records must end no earlier than the server's time
// before the call plus the lease asked for. Before the fix both the server
// time and the lease were truncated to the millisecond, so such a lease
// recorded as little as ~0 ms.
func TestLeaseNeverShorterThanAsked(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
	s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const lease = 1999 * time.Microsecond
	const ttl = time.Hour + 999*time.Microsecond
	req := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Lease: lease, TTL: ttl}
	}
	check := func(what string, t0 int64, r idem.Record, ttl time.Duration) {
		t.Helper()
		if got, min := r.LeaseUntil.UnixMicro(), t0+lease.Microseconds(); got < min {
			t.Fatalf("%s: LeaseUntil %d µs, but the server's time before the call plus the lease is %d µs (%d µs short)", what, got, min, min-got)
		}
		if ttl > 0 {
			if got, min := r.ExpiresAt.UnixMicro(), t0+ttl.Microseconds(); got < min {
				t.Fatalf("%s: ExpiresAt %d µs < %d µs", what, got, min)
			}
		}
	}
	for i := range 20 {
		k := "k" + strconv.Itoa(i)
		t0 := serverMicros(t, c)
		cl, err := s.Claim(ctx, req(k))
		if err != nil || cl.Outcome != idem.OutcomeAcquired {
			t.Fatalf("Claim: %v %v", cl.Outcome, err)
		}
		check("Claim "+k, t0, cl.Record, ttl)
		// Takeover once the lease has run out.
		for {
			t0 = serverMicros(t, c)
			cl, err = s.Claim(ctx, req(k))
			if err != nil {
				t.Fatal(err)
			}
			if cl.Outcome == idem.OutcomeAcquired {
				break
			}
			time.Sleep(time.Millisecond)
		}
		check("takeover "+k, t0, cl.Record, ttl)
		t0 = serverMicros(t, c)
		res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{req("b" + k), req("c" + k)})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			check("ClaimBatch", t0, r.Claim.Record, ttl)
		}
		t0 = serverMicros(t, c)
		if err := s.Extend(ctx, []byte("b"+k), res[0].Claim.Record.Token, lease); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctx, []byte("b"+k))
		if err != nil {
			t.Fatal(err)
		}
		check("Extend", t0, rec, 0)
	}
}
