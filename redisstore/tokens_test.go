package redisstore_test

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
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
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
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

// TestClaimReturnsStoredRecord checks that what Claim and ClaimBatch return
// is what Get reads back, for keys acquired fresh (the record is built by
// the client: the script's reply carries only token and time), for keys
// found (the stored record comes back) and for takeovers; and that a record
// in format 2, as an earlier build wrote it, is read, taken over and
// completed after an upgrade.
func TestClaimReturnsStoredRecord(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
	for _, coalesce := range []bool{false, true} {
		s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix + strconv.FormatBool(coalesce) + ":", NoCoalesce: !coalesce})
		ctx := context.Background()
		same := func(what string, got idem.Record) {
			t.Helper()
			want, err := s.Get(ctx, got.Key)
			if err != nil {
				t.Fatalf("%s: Get: %v", what, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s:\nclaim returned %+v\nGet read       %+v", what, got, want)
			}
		}
		reqs := []idem.ClaimRequest{
			{Key: []byte("a"), Lease: time.Minute, TTL: time.Hour},
			{Key: []byte("b|x"), Lease: 2 * time.Hour, TTL: time.Hour, Fingerprint: []byte("fp|\x00\xff")},
			{Key: []byte("a"), Lease: time.Minute, TTL: time.Hour}, // repeated: in progress
			{Key: []byte("short"), Lease: 40 * time.Millisecond, TTL: time.Hour},
		}
		res, err := s.ClaimBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		want := []idem.Outcome{idem.OutcomeAcquired, idem.OutcomeAcquired, idem.OutcomeInProgress, idem.OutcomeAcquired}
		for i, r := range res {
			if r.Err != nil || r.Claim.Outcome != want[i] {
				t.Fatalf("entry %d: %v %v, want %v", i, r.Claim.Outcome, r.Err, want[i])
			}
			same("batch entry "+strconv.Itoa(i), r.Claim.Record)
		}
		cl, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("single"), Lease: time.Minute, TTL: time.Hour, Fingerprint: []byte("f")})
		if err != nil || cl.Outcome != idem.OutcomeAcquired {
			t.Fatalf("Claim: %v %v", cl.Outcome, err)
		}
		same("single", cl.Record)
		time.Sleep(60 * time.Millisecond) // "short"'s lease runs out
		cl, err = s.Claim(ctx, idem.ClaimRequest{Key: []byte("short"), Lease: time.Minute, TTL: time.Hour})
		if err != nil || cl.Outcome != idem.OutcomeAcquired || cl.Record.Attempts != 2 {
			t.Fatalf("takeover: %v %+v %v", cl.Outcome, cl.Record, err)
		}
		same("takeover", cl.Record)
	}

	// Upgrade: a format 2 record whose lease ran out is taken over (and
	// rewritten in format 3), then completed.
	s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix + "v2:", NoCoalesce: true, Shards: 1})
	rk := prefix + "v2::{0}:k:old" // see TestKeyLayout
	ctx := context.Background()
	now := time.Now().Add(-time.Minute).UnixMilli()
	ns := strconv.FormatInt(now, 10)
	old := "2|p|5|1|" + ns + "|1000|" + ns + "|3600000|" + ns + "|" + ns + "|3600000|2|0|fp"
	if err := c.Set(ctx, rk, old, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, []byte("old"))
	if err != nil || r.Token != 5 || r.State != idem.StateInProgress || string(r.Fingerprint) != "fp" || r.LeaseUntil.UnixMilli() != now+1000 {
		t.Fatalf("format 2 record read as %+v %v", r, err)
	}
	cl, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("old"), Lease: time.Minute, TTL: time.Hour, Fingerprint: []byte("fp")})
	if err != nil || cl.Outcome != idem.OutcomeAcquired || cl.Record.Attempts != 2 || cl.Record.Token <= 5 || !cl.Record.CreatedAt.Equal(r.CreatedAt) {
		t.Fatalf("takeover of a format 2 record: %v %+v %v", cl.Outcome, cl.Record, err)
	}
	if err := s.Complete(ctx, []byte("old"), cl.Record.Token, []byte("done")); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, []byte("old")); err != nil || r.State != idem.StateCompleted || string(r.Result) != "done" {
		t.Fatalf("after Complete: %+v %v", r, err)
	}
	if raw := c.Get(ctx, rk).Val(); !strings.HasPrefix(raw, "3|c|") {
		t.Fatalf("rewritten record %q, want format 3", raw)
	}
}
