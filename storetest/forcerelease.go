package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// testForceRelease checks idem.ForceReleaser: an operator releases a key
// stuck in progress whatever its token; the holder is fenced and the next
// claim acquires with a larger token.
func (s *suite) testForceRelease(t *testing.T) {
	st := s.store(t)
	fr, ok := st.(idem.ForceReleaser)
	if !ok {
		if s.feat.ForceRelease {
			t.Fatalf("Features.ForceRelease is set but %T is not an idem.ForceReleaser", st)
		}
		t.Skip("store is not an idem.ForceReleaser")
	}
	ctx := ctxT(t)
	k := []byte("stuck")

	mustIs(t, "ForceRelease of an absent key", fr.ForceRelease(ctx, k, "op"), idem.ErrNotFound)
	mustIs(t, "ForceRelease of an empty key", fr.ForceRelease(ctx, nil, "op"), idem.ErrInvalidKey)

	r := req("stuck", longLease, longTTL)
	r.Fingerprint = []byte("fp-1")
	c := mustClaim(t, st, r, idem.OutcomeAcquired)
	mustOK(t, "ForceRelease", fr.ForceRelease(ctx, k, "worker host-7 is gone"))
	got := mustGet(t, st, "stuck")
	if got.State != idem.StateReleased || got.Token != c.Record.Token || got.Attempts != 1 ||
		got.LastError != "worker host-7 is gone" || string(got.Fingerprint) != "fp-1" {
		t.Fatalf("after ForceRelease: %+v (claimed %+v)", got, c.Record)
	}
	// The holder is fenced.
	mustIs(t, "holder's Complete", st.Complete(ctx, k, c.Record.Token, []byte("late")), idem.ErrFenced)
	mustIs(t, "holder's Extend", st.Extend(ctx, k, c.Record.Token, longLease), idem.ErrFenced)
	mustIs(t, "holder's Fail", st.Fail(ctx, k, c.Record.Token, "x"), idem.ErrFenced)
	mustIs(t, "ForceRelease of a released key", fr.ForceRelease(ctx, k, "again"), idem.ErrNotInProgress)

	c2 := mustClaim(t, st, r, idem.OutcomeAcquired)
	if c2.Record.Token <= c.Record.Token || c2.Record.Attempts != 2 {
		t.Fatalf("claim after ForceRelease: token %d (old %d), attempts %d", c2.Record.Token, c.Record.Token, c2.Record.Attempts)
	}
	// An empty cause keeps the last error.
	mustOK(t, "ForceRelease without cause", fr.ForceRelease(ctx, k, ""))
	if got := mustGet(t, st, "stuck"); got.LastError != "worker host-7 is gone" || got.State != idem.StateReleased {
		t.Fatalf("ForceRelease with empty cause: %+v", got)
	}

	// Completed and failed records are left alone.
	c3 := mustClaim(t, st, r, idem.OutcomeAcquired)
	mustOK(t, "Complete", st.Complete(ctx, k, c3.Record.Token, []byte("done")))
	mustIs(t, "ForceRelease of a completed key", fr.ForceRelease(ctx, k, "op"), idem.ErrNotInProgress)
	if got := mustGet(t, st, "stuck"); got.State != idem.StateCompleted || string(got.Result) != "done" {
		t.Fatalf("completed record changed: %+v", got)
	}
	f := mustClaim(t, st, req("poison", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Fail", st.Fail(ctx, []byte("poison"), f.Record.Token, "bad"))
	mustIs(t, "ForceRelease of a failed key", fr.ForceRelease(ctx, []byte("poison"), "op"), idem.ErrNotInProgress)

	// A lapsed lease is released too.
	lapsed := mustClaim(t, st, req("lapsed", s.feat.LeaseUnit, longTTL), idem.OutcomeAcquired)
	time.Sleep(3 * s.feat.LeaseUnit)
	mustOK(t, "ForceRelease of a lapsed lease", fr.ForceRelease(ctx, []byte("lapsed"), "op"))
	mustIs(t, "lapsed holder's Complete", st.Complete(ctx, []byte("lapsed"), lapsed.Record.Token, nil), idem.ErrFenced)

	// Another namespace's record of the same key is untouched.
	other := s.f(t, NewNamespace())
	oc := mustClaim(t, other, req("iso", longLease, longTTL), idem.OutcomeAcquired)
	mustIs(t, "ForceRelease in the other namespace", fr.ForceRelease(ctx, []byte("iso"), "op"), idem.ErrNotFound)
	mustOK(t, "Complete in the other namespace", other.Complete(ctx, []byte("iso"), oc.Record.Token, nil))

	// One atomic step: racing the holder's Complete, exactly one wins.
	for i := 0; i < 20; i++ {
		key := []byte("race-" + string(rune('a'+i)))
		c := mustClaim(t, st, req(string(key), longLease, longTTL), idem.OutcomeAcquired)
		var wg sync.WaitGroup
		var cerr, ferr error
		wg.Add(2)
		go func() { defer wg.Done(); cerr = st.Complete(ctx, key, c.Record.Token, []byte("r")) }()
		go func() { defer wg.Done(); ferr = fr.ForceRelease(ctx, key, "op") }()
		wg.Wait()
		got := mustGet(t, st, string(key))
		switch {
		case cerr == nil && errors.Is(ferr, idem.ErrNotInProgress) && got.State == idem.StateCompleted:
		case ferr == nil && errors.Is(cerr, idem.ErrFenced) && got.State == idem.StateReleased:
		default:
			t.Fatalf("race %d: Complete %v, ForceRelease %v, record %s", i, cerr, ferr, got.State)
		}
	}
}
