package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

// FuzzDecodeClaims feeds the claim script's reply decoder arbitrary
// replies (header, then index/code/record triples, as RESP gives them):
// it never panics; a reply it accepts gives every request exactly one
// result, and a key the reply does not mention was acquired fresh under
// the reply's token.
func FuzzDecodeClaims(f *testing.F) {
	rec := "3|c|1764450000000200|2|1764450000000|1764450001000|1764450000000|1764450001000|60000|3600000|3600000|0|1|r"
	f.Add("17", "1764450000000", int64(0), int64(2), rec, int64(1), int64(9), "", uint8(2))
	f.Add("17", "1764450000000", int64(1), int64(8), "garbage", int64(1), int64(3), rec, uint8(2))
	f.Add("0", "x", int64(-1), int64(5), "", int64(7), int64(1), "", uint8(1))
	f.Add("18446744073709551615", "-1", int64(0), int64(1), rec, int64(0), int64(1), rec, uint8(3))
	f.Fuzz(func(t *testing.T, tok, now string, i1, c1 int64, r1 string, i2, c2 int64, r2 string, n uint8) {
		if n == 0 || n > 8 {
			return
		}
		reqs := make([]idem.ClaimRequest, n)
		for i := range reqs {
			reqs[i] = idem.ClaimRequest{Key: []byte{'k', byte('0' + i)}, Lease: time.Second, TTL: time.Minute}
		}
		for _, entries := range [][]any{{}, {i1, c1, r1}, {i1, c1, r1, i2, c2, r2}} {
			cmd := redis.NewCmd(context.Background())
			cmd.SetVal(append([]any{tok, now}, entries...))
			out, err := decodeClaims(cmd, reqs)
			if err != nil {
				continue
			}
			if len(out) != len(reqs) {
				t.Fatalf("%d results for %d requests", len(out), len(reqs))
			}
			mentioned := map[int64]bool{}
			for j := 0; j < len(entries); j += 3 {
				mentioned[entries[j].(int64)] = true
			}
			for i, r := range out {
				if r.Err != nil {
					continue
				}
				if r.Claim.Outcome < idem.OutcomeAcquired || r.Claim.Outcome > idem.OutcomeFailed {
					t.Fatalf("result %d: outcome %v", i, r.Claim.Outcome)
				}
				if !mentioned[int64(i)] && (r.Claim.Outcome != idem.OutcomeAcquired || r.Claim.Record.Token == 0 || string(r.Claim.Record.Key) != string(reqs[i].Key)) {
					t.Fatalf("unmentioned key %d: %+v", i, r.Claim)
				}
			}
		}
	})
}
