package pgstore_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// TestBatchFastPath checks the insert-only first statement of ClaimBatch:
// records it builds client-side equal what Get reads back, a batch larger
// than one statement's token range (1024 rows per table) gets distinct
// tokens, and keys that already had a row go through the takeover
// statement with the same outcomes as single claims.
func TestBatchFastPath(t *testing.T) {
	for _, lc := range layouts {
		t.Run(lc.name, func(t *testing.T) {
			s, _ := newStore(t, lc, "fast")
			ctx := ctxT(t)
			held, err := s.Claim(ctx, claimReq("held"))
			if err != nil {
				t.Fatal(err)
			}
			done, err := s.Claim(ctx, claimReq("done"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, []byte("done"), done.Record.Token, []byte("r")); err != nil {
				t.Fatal(err)
			}
			rel, err := s.Claim(ctx, claimReq("rel"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, []byte("rel"), rel.Record.Token, "again"); err != nil {
				t.Fatal(err)
			}
			const n = 2500
			reqs := make([]idem.ClaimRequest, 0, n+3)
			for i := range n {
				r := idem.ClaimRequest{Key: fmt.Appendf(nil, "fresh-%d", i), Lease: time.Duration(i+1) * time.Millisecond * 37, TTL: time.Hour + time.Duration(i)*time.Microsecond}
				if i%3 == 0 {
					r.Fingerprint = fmt.Appendf(nil, "fp-%d", i)
				}
				reqs = append(reqs, r)
			}
			reqs = append(reqs, claimReq("held"), claimReq("done"), claimReq("rel"))
			res, err := s.ClaimBatch(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			tokens := map[uint64]bool{}
			for i := range n {
				r := res[i]
				if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
					t.Fatalf("entry %d: %s, %v", i, r.Claim.Outcome, r.Err)
				}
				tok := r.Claim.Record.Token
				if tokens[tok] || tok <= rel.Record.Token {
					t.Fatalf("entry %d: token %d repeated or not above earlier tokens (%d)", i, tok, rel.Record.Token)
				}
				tokens[tok] = true
				if i%97 != 0 && i < n-3 {
					continue
				}
				got, err := s.Get(ctx, reqs[i].Key)
				if err != nil {
					t.Fatal(err)
				}
				if !sameRecord(got, r.Claim.Record) {
					t.Fatalf("entry %d: batch returned %+v, Get reads %+v", i, r.Claim.Record, got)
				}
			}
			if o := res[n].Claim.Outcome; o != idem.OutcomeInProgress || res[n].Claim.Record.Token != held.Record.Token {
				t.Errorf("held key: %s token %d, want in progress %d", o, res[n].Claim.Record.Token, held.Record.Token)
			}
			if o := res[n+1].Claim.Outcome; o != idem.OutcomeCompleted || string(res[n+1].Claim.Record.Result) != "r" {
				t.Errorf("completed key: %s %q", o, res[n+1].Claim.Record.Result)
			}
			if c := res[n+2].Claim; c.Outcome != idem.OutcomeAcquired || c.Record.Token <= rel.Record.Token || c.Record.Attempts != 2 {
				t.Errorf("released key: %s token %d (was %d) attempts %d", c.Outcome, c.Record.Token, rel.Record.Token, c.Record.Attempts)
			}
			// The tokens the fast path handed out complete.
			cs := make([]idem.Completion, n)
			for i := range n {
				cs[i] = idem.Completion{Key: reqs[i].Key, Token: res[i].Claim.Record.Token}
			}
			errs, err := s.CompleteBatch(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range errs {
				if e != nil {
					t.Fatalf("complete %d: %v", i, e)
				}
			}
		})
	}
}

// TestBatchTokensGrowAcrossPurge claims keys by batch, lets them expire,
// purges them and claims them again: the new tokens (fresh inserts, one
// sequence value per statement) exceed the old ones.
func TestBatchTokensGrowAcrossPurge(t *testing.T) {
	for _, lc := range layouts {
		t.Run(lc.name, func(t *testing.T) {
			s, _ := newStore(t, lc, "purge")
			ctx := ctxT(t)
			reqs := make([]idem.ClaimRequest, 50)
			for i := range reqs {
				reqs[i] = idem.ClaimRequest{Key: fmt.Appendf(nil, "p-%d", i), Lease: 20 * time.Millisecond, TTL: 20 * time.Millisecond}
			}
			last := make([]uint64, len(reqs))
			for round := range 3 {
				res, err := s.ClaimBatch(ctx, reqs)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range res {
					if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
						t.Fatalf("round %d entry %d: %s, %v", round, i, r.Claim.Outcome, r.Err)
					}
					if r.Claim.Record.Token <= last[i] {
						t.Fatalf("round %d entry %d: token %d not above %d", round, i, r.Claim.Record.Token, last[i])
					}
					last[i] = r.Claim.Record.Token
				}
				time.Sleep(50 * time.Millisecond)
				if round == 1 {
					continue // this round's records are taken over, not purged
				}
				if _, err := s.Purge(ctx, 0); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func sameRecord(a, b idem.Record) bool {
	return bytes.Equal(a.Key, b.Key) && a.State == b.State && a.Token == b.Token &&
		bytes.Equal(a.Fingerprint, b.Fingerprint) && (a.Fingerprint == nil) == (b.Fingerprint == nil) &&
		bytes.Equal(a.Result, b.Result) && (a.Result == nil) == (b.Result == nil) &&
		a.Attempts == b.Attempts && a.LastError == b.LastError &&
		a.LeaseUntil.Equal(b.LeaseUntil) && a.ExpiresAt.Equal(b.ExpiresAt) &&
		a.CreatedAt.Equal(b.CreatedAt) && a.UpdatedAt.Equal(b.UpdatedAt)
}
