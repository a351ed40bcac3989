package idem_test

import (
	"context"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
)

// A batch claim that fails open reports each key's failed claim to
// OnClaim, as a single claim that fails open does: promidem counts store
// errors (idem_store_errors_total, idem_claims_total{outcome="error"})
// from it, and a batch claim "counts each key".
func TestBatchFailOpenReportsEachClaim(t *testing.T) {
	fs := faultstore.New(newMem(t))
	fs.SetDown(true)
	var hooks countHook
	var withErr int
	h := hooks.hooks()
	onClaim := h.OnClaim
	h.OnClaim = func(ctx context.Context, e idem.ClaimEvent) {
		if e.Err != nil {
			withErr++
		}
		onClaim(ctx, e)
	}
	g := newGuard(t, fs.WithBatch(), idem.WithFailOpen(true), idem.WithHooks(h))
	if _, _, err := g.Acquire(ctx, []byte("single")); err != nil {
		t.Fatal(err)
	}
	acqs, err := g.AcquireBatch(ctx, []idem.BatchItem{{Key: []byte("x")}, {Key: []byte("y")}})
	if err != nil || len(acqs) != 2 || !acqs[0].Result.FailedOpen {
		t.Fatalf("AcquireBatch: %+v, %v", acqs, err)
	}
	if hooks.failOpen.Load() != 3 {
		t.Fatalf("%d fail-open passes, want 3", hooks.failOpen.Load())
	}
	if hooks.claims.Load() != 3 || withErr != 3 {
		t.Fatalf("OnClaim saw %d claims (%d with the store's error) for 3 failed claims let through", hooks.claims.Load(), withErr)
	}
}
