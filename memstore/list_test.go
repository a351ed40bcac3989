package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

// TestListInProgressPagesHonourLimit: a page never holds more than limit
// records (the dashboard asked for 20 and got 22 when a shard held more),
// and paging lists every in-progress key exactly once.
func TestListInProgressPagesHonourLimit(t *testing.T) {
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const n = 1000
	for i := range n {
		req := idem.ClaimRequest{Key: fmt.Appendf(nil, "k-%04d", i), Lease: time.Minute, TTL: time.Hour}
		if _, err := s.Claim(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{1, 7, 64, 999, 1000, 5000} {
		seen := map[string]bool{}
		cursor, pages := "", 0
		for {
			recs, next, err := s.ListInProgress(ctx, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) > limit {
				t.Fatalf("limit %d: page of %d records", limit, len(recs))
			}
			for _, r := range recs {
				if seen[string(r.Key)] {
					t.Fatalf("limit %d: %q listed twice", limit, r.Key)
				}
				seen[string(r.Key)] = true
			}
			pages++
			if next == "" {
				break
			}
			if pages > 2*n {
				t.Fatalf("limit %d: paging does not end", limit)
			}
			cursor = next
		}
		if len(seen) != n {
			t.Fatalf("limit %d: listed %d of %d keys", limit, len(seen), n)
		}
	}
	for _, bad := range []string{"x", "-1", "99999", "3:", "3:zz", "3:"} {
		if _, _, err := s.ListInProgress(ctx, bad, 10); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Fatalf("cursor %q: err %v, want ErrInvalidArgument", bad, err)
		}
	}
}
