//go:build !race

package memstore_test

import (
	"fmt"
	"runtime/debug"
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
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
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

// ClaimBatchInto writes into the caller's results: a batch of keys in
// progress (no record made, no fingerprint copied) allocates nothing,
// where ClaimBatch allocates its results.
func TestClaimBatchIntoAllocs(t *testing.T) {
	s, _ := memstore.New(memstore.Config{})
	defer s.Close()
	reqs := make([]idem.ClaimRequest, 100)
	for i := range reqs {
		reqs[i] = idem.ClaimRequest{Key: fmt.Appendf(nil, "key-%d", i), Lease: time.Minute, TTL: time.Hour}
	}
	if _, err := s.ClaimBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	out := make([]idem.BatchResult, len(reqs))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	allocs := testing.AllocsPerRun(50, func() {
		if err := s.ClaimBatchInto(ctx, reqs, out); err != nil || out[0].Claim.Outcome != idem.OutcomeInProgress {
			t.Fatalf("ClaimBatchInto: %v %v", out[0].Claim.Outcome, err)
		}
	})
	if allocs != 0 {
		t.Errorf("ClaimBatchInto of %d keys in progress: %.0f allocations, want 0", len(reqs), allocs)
	}
}
