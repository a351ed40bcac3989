//go:build !race

// The race detector makes sync.Pool drop items at random and adds
// allocations of its own: these counts hold without it. The tests stop
// the GC while they count (a collection empties the pools).

package idem_test

import (
	"context"
	"fmt"
	"reflect"
	"runtime/debug"
	"testing"

	"github.com/idem-dev/idem"
)

// replayStore answers every batch claim "completed" from one slice of
// results made up front (when res is set; the memory store claims
// otherwise), and every batch completion from one slice of nils: what the
// guard allocates around the store is all that is left to count.
type replayStore struct {
	idem.Store
	res  []idem.BatchResult
	errs []error
}

func (s *replayStore) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	if s.res == nil {
		return s.Store.(idem.BatchClaimer).ClaimBatch(ctx, reqs)
	}
	return s.res[:len(reqs)], nil
}

func (s *replayStore) CompleteBatch(_ context.Context, cs []idem.Completion) ([]error, error) {
	return s.errs[:len(cs)], nil
}

func batchItems(n int, prefix string) []idem.BatchItem {
	items := make([]idem.BatchItem, n)
	for i := range items {
		items[i] = idem.BatchItem{Key: fmt.Appendf(nil, "%s-%d", prefix, i), Fingerprint: []byte("fp")}
	}
	return items
}

// AcquireBatch allocates its results and nothing else per batch: its
// request list, the index of the keys sent to the store and their
// holding entries are scratch reused from batch to batch.
func TestAcquireBatchAllocs(t *testing.T) {
	const n = 256
	st := &replayStore{Store: newMem(t), res: make([]idem.BatchResult, n)}
	for i := range st.res {
		st.res[i].Claim = idem.Claim{Outcome: idem.OutcomeCompleted, Record: idem.Record{State: idem.StateCompleted, Token: 1, Attempts: 1}}
	}
	g := newGuard(t, st)
	items := batchItems(n, "k")
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	allocs := testing.AllocsPerRun(50, func() {
		acqs, err := g.AcquireBatch(ctx, items)
		if err != nil || len(acqs) != n || acqs[0].Held != nil || !acqs[0].Result.Replayed {
			t.Fatalf("AcquireBatch: %v (%d results)", err, len(acqs))
		}
	})
	if allocs > 1 {
		t.Errorf("AcquireBatch of %d replayed keys: %.0f allocations, want 1 (the results)", n, allocs)
	}
}

// CompleteBatch allocates its errors and its round's context and nothing
// else per batch (the claims' settle ops live in their Held; a batch's
// Helds do not carry a round context each, as a single claim's does).
func TestCompleteBatchAllocs(t *testing.T) {
	const n, runs = 256, 20
	g := newGuard(t, &replayStore{Store: newMem(t), errs: make([]error, n)})
	var batches [][]*idem.Held
	for r := 0; r < runs+1; r++ {
		acqs, err := g.AcquireBatch(ctx, batchItems(n, fmt.Sprint("c", r)))
		if err != nil {
			t.Fatal(err)
		}
		hs := make([]*idem.Held, n)
		for i, a := range acqs {
			if a.Held == nil {
				t.Fatalf("not acquired: %v", a.Err)
			}
			hs[i] = a.Held
		}
		batches = append(batches, hs)
	}
	next := 0
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	allocs := testing.AllocsPerRun(runs, func() {
		hs := batches[next]
		next++
		for i, err := range g.CompleteBatch(ctx, hs, nil) {
			if err != nil {
				t.Fatalf("complete %d: %v", i, err)
			}
		}
	})
	if allocs > 2 {
		t.Errorf("CompleteBatch of %d claims: %.0f allocations, want 2 (the errors, the round's context)", n, allocs)
	}
}

// intoStore is a BatchClaimerInto answering "completed" into the caller's
// results; its ClaimBatch must not be used.
type intoStore struct {
	idem.Store
	outs map[*idem.BatchResult]bool // the results slices it was given
}

func (s *intoStore) ClaimBatch(context.Context, []idem.ClaimRequest) ([]idem.BatchResult, error) {
	panic("ClaimBatch called on a BatchClaimerInto")
}

func (s *intoStore) ClaimBatchInto(_ context.Context, reqs []idem.ClaimRequest, out []idem.BatchResult) error {
	if len(out) != len(reqs) {
		return fmt.Errorf("%w: %d results for %d claims", idem.ErrInvalidArgument, len(out), len(reqs))
	}
	s.outs[&out[0]] = true
	for i := range out {
		if !reflect.ValueOf(out[i]).IsZero() {
			return fmt.Errorf("result %d not zero: %+v", i, out[i])
		}
		out[i].Claim = idem.Claim{Outcome: idem.OutcomeCompleted, Record: idem.Record{State: idem.StateCompleted, Token: 1, Attempts: 1}}
	}
	return nil
}

// On a BatchClaimerInto the guard lends the store one results slice,
// zeroed, from batch to batch: AcquireBatch still allocates only what it
// returns.
func TestAcquireBatchIntoAllocs(t *testing.T) {
	const n = 256
	st := &intoStore{Store: newMem(t), outs: map[*idem.BatchResult]bool{}}
	g := newGuard(t, st)
	items := batchItems(n, "k")
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	allocs := testing.AllocsPerRun(50, func() {
		acqs, err := g.AcquireBatch(ctx, items)
		if err != nil || len(acqs) != n || acqs[n-1].Held != nil || !acqs[n-1].Result.Replayed {
			t.Fatalf("AcquireBatch: %v (%d results)", err, len(acqs))
		}
	})
	if allocs > 1 {
		t.Errorf("AcquireBatch of %d replayed keys: %.0f allocations, want 1 (the results)", n, allocs)
	}
	if len(st.outs) != 1 {
		t.Errorf("the store was lent %d results slices in 51 batches, want 1", len(st.outs))
	}
}

// A single claim's Complete allocates nothing: the Held came with the
// context of its first settle round.
func TestCompleteAllocs(t *testing.T) {
	const runs = 100
	g := newGuard(t, newMem(t))
	hs := make([]*idem.Held, runs+1)
	for i := range hs {
		h, _, err := g.Acquire(ctx, fmt.Appendf(nil, "single-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
	}
	next := 0
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	allocs := testing.AllocsPerRun(runs, func() {
		if err := hs[next].Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
		next++
	})
	if allocs != 0 {
		t.Errorf("Complete of a single claim: %.0f allocations, want 0", allocs)
	}
}
