//go:build !race

package memstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

// A claim of a new key with a SHA-256 fingerprint allocates its record
// and the map's copy of the key, nothing else (the fingerprint is kept
// inside the record). Map growth is amortised over the runs.
func TestClaimAllocs(t *testing.T) {
	const runs = 2000
	s, _ := memstore.New(memstore.Config{Shards: 1})
	defer s.Close()
	reqs := make([]idem.ClaimRequest, runs+1)
	fp := idem.FingerprintOf([]byte("payload"))
	for i := range reqs {
		reqs[i] = idem.ClaimRequest{Key: fmt.Appendf(nil, "key-%d", i), Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
	}
	next := 0
	allocs := testing.AllocsPerRun(runs, func() {
		c, err := s.Claim(ctx, reqs[next])
		next++
		if err != nil || c.Outcome != idem.OutcomeAcquired {
			t.Fatalf("claim: %v %v", c.Outcome, err)
		}
	})
	if allocs > 2 {
		t.Errorf("a claim of a new key: %.0f allocations, want 2 (its record and the map's key)", allocs)
	}
}
