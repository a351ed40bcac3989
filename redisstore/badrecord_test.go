package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// damage replaces key's record: "string" with bytes that are no record,
// "hash" with a hash, on which every string command fails with WRONGTYPE.
// Either keeps a TTL so a failed test leaves nothing behind for long.
func damage(t testing.TB, c redis.UniversalClient, s *redisstore.Store, key, how string) {
	t.Helper()
	ctx := context.Background()
	rk := s.RecordKey([]byte(key))
	var err error
	switch how {
	case "string":
		err = c.Set(ctx, rk, "garbage|not a record", 10*time.Minute).Err()
	case "hash":
		if err = c.Del(ctx, rk).Err(); err == nil {
			if err = c.HSet(ctx, rk, "s", "p").Err(); err == nil {
				err = c.PExpire(ctx, rk, 10*time.Minute).Err()
			}
		}
	default:
		t.Fatalf("damage: unknown kind %q", how)
	}
	if err != nil {
		t.Fatalf("damage %s: %v", key, err)
	}
}

// checkDamaged checks that the store left a damaged record as it was.
func checkDamaged(t testing.TB, c redis.UniversalClient, s *redisstore.Store, key, how string) {
	t.Helper()
	ctx := context.Background()
	rk := s.RecordKey([]byte(key))
	typ, err := c.Type(ctx, rk).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"string": "string", "hash": "hash"}[how]
	if typ != want {
		t.Fatalf("%s: type %q after the claim, want %q (the store rewrote a damaged record)", key, typ, want)
	}
	if how == "string" {
		if v, _ := c.Get(ctx, rk).Result(); v != "garbage|not a record" {
			t.Fatalf("%s: %q after the claim", key, v)
		}
	}
}

// TestClaimBatchBadRecordMidScript: a batch whose script meets a corrupt
// record and a WRONGTYPE key in the middle (Shards 1, so on a cluster too
// every key is in one script) must report those two entries as per-key
// ErrCorrupt and claim every other key, with nothing left held by nobody.
// Before the fix the script stopped at the first bad key, the keys before
// it stayed in progress (written, never reported), and the call failed as a
// whole with an error that was neither ErrUnavailable nor ErrUnknownOutcome.
func TestClaimBatchBadRecordMidScript(t *testing.T) {
	run := func(t *testing.T, c redis.UniversalClient) {
		prefix := uniquePrefix()
		t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, ns := range []string{"coalesced", "single"} {
			s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix, Namespace: ns, Shards: 1, NoCoalesce: ns == "single"})
			done, err := s.Claim(ctx, claimReq("done"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, []byte("done"), done.Record.Token, []byte("r")); err != nil {
				t.Fatal(err)
			}
			damage(t, c, s, "bad-str", "string")
			damage(t, c, s, "bad-hash", "hash")
			keys := []string{"g0", "g1", "bad-str", "g3", "bad-hash", "done", "g6", "g0"}
			var reqs []idem.ClaimRequest
			for _, k := range keys {
				reqs = append(reqs, claimReq(k))
			}
			res, err := s.ClaimBatch(ctx, reqs)
			if err != nil {
				t.Fatalf("ClaimBatch with two bad records: %v, want per-key errors", err)
			}
			want := []idem.Outcome{idem.OutcomeAcquired, idem.OutcomeAcquired, 0, idem.OutcomeAcquired, 0,
				idem.OutcomeCompleted, idem.OutcomeAcquired, idem.OutcomeInProgress}
			for i, r := range res {
				if want[i] == 0 {
					if !errors.Is(r.Err, idem.ErrCorrupt) {
						t.Fatalf("entry %d (%s): %v %v, want ErrCorrupt", i, keys[i], r.Claim.Outcome, r.Err)
					}
					if errors.Is(r.Err, idem.ErrUnavailable) {
						t.Fatalf("entry %d (%s): %v: a corrupt record is no outage", i, keys[i], r.Err)
					}
					continue
				}
				if r.Err != nil || r.Claim.Outcome != want[i] {
					t.Fatalf("entry %d (%s): %v %v, want %v", i, keys[i], r.Claim.Outcome, r.Err, want[i])
				}
			}
			// Every key the batch acquired is on record with its token.
			for i, r := range res[:7] {
				if r.Claim.Outcome != idem.OutcomeAcquired {
					continue
				}
				rec, err := s.Get(ctx, []byte(keys[i]))
				if err != nil || rec.State != idem.StateInProgress || rec.Token != r.Claim.Record.Token {
					t.Fatalf("%s after the batch: %+v %v", keys[i], rec, err)
				}
			}
			checkDamaged(t, c, s, "bad-str", "string")
			checkDamaged(t, c, s, "bad-hash", "hash")
			// Listing and counting skip what is not a record.
			var listed []idem.Record
			for cur := ""; ; {
				page, next, err := s.ListInProgress(ctx, cur, 100)
				if err != nil {
					t.Fatalf("ListInProgress beside damaged records: %v", err)
				}
				listed = append(listed, page...)
				if cur = next; cur == "" {
					break
				}
			}
			if len(listed) != 4 {
				t.Fatalf("ListInProgress: %d records, want the 4 acquired", len(listed))
			}
			if st, err := s.Stats(ctx); err != nil || st.InProgress != 4 || st.Completed != 1 || st.Total() != 5 {
				t.Fatalf("Stats beside damaged records: %+v %v", st, err)
			}
			// One by one, a bad record is the caller's own error, and Get says so too.
			for _, k := range []string{"bad-str", "bad-hash"} {
				if _, err := s.Claim(ctx, claimReq(k)); !errors.Is(err, idem.ErrCorrupt) {
					t.Fatalf("Claim %s: %v, want ErrCorrupt", k, err)
				}
				if _, err := s.Get(ctx, []byte(k)); !errors.Is(err, idem.ErrCorrupt) {
					t.Fatalf("Get %s: %v, want ErrCorrupt", k, err)
				}
			}
		}
	}
	t.Run("single", func(t *testing.T) { run(t, sharedClient(t)) })
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		run(t, c)
	})
}

// TestCompleteBatchWrongType: a WRONGTYPE key in the middle of a complete
// batch fails its own entry; the entries after it are still settled (before
// the fix the script stopped there: the call failed although the entries
// before it had been completed).
func TestCompleteBatchWrongType(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
	s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{claimReq("a"), claimReq("h"), claimReq("b")})
	if err != nil {
		t.Fatal(err)
	}
	damage(t, c, s, "h", "hash")
	cs := make([]idem.Completion, len(res))
	for i, r := range res {
		cs[i] = idem.Completion{Key: r.Claim.Record.Key, Token: r.Claim.Record.Token}
	}
	errs, err := s.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatalf("CompleteBatch with a WRONGTYPE entry: %v", err)
	}
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], idem.ErrCorrupt) {
		t.Fatalf("errs = %v, want only the WRONGTYPE entry to fail with ErrCorrupt", errs)
	}
	for _, k := range []string{"a", "b"} {
		if rec, err := s.Get(ctx, []byte(k)); err != nil || rec.State != idem.StateCompleted {
			t.Fatalf("%s: %+v %v", k, rec, err)
		}
	}
	for _, op := range []func() error{
		func() error { return s.Complete(ctx, cs[1].Key, cs[1].Token, nil) },
		func() error { return s.Release(ctx, cs[1].Key, cs[1].Token, "") },
		func() error { return s.Extend(ctx, cs[1].Key, cs[1].Token, time.Minute) },
	} {
		if err := op(); !errors.Is(err, idem.ErrCorrupt) {
			t.Fatalf("update of a WRONGTYPE record: %v, want ErrCorrupt", err)
		}
	}
}
