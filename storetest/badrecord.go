package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem"
)

// errorClassifier is idem.ErrorClassifier, spelled out so that the suite
// does not depend on when the root package gains it.
type errorClassifier interface{ ClassifyError(err error) error }

// mustCorrupt checks the error of an operation on a damaged record: it
// matches idem.ErrCorrupt, names the key, and looks like nothing an
// infrastructure fault would give (fail-open passes on ErrUnavailable;
// ErrUnknownOutcome makes callers retry). The store's own classifier, if it
// has one, must keep it so.
func mustCorrupt(t testing.TB, st idem.Store, what, key string, err error) {
	t.Helper()
	if !errors.Is(err, idem.ErrCorrupt) {
		t.Fatalf("%s of damaged record %q: err = %v, want idem.ErrCorrupt", what, key, err)
	}
	for _, infra := range []error{idem.ErrUnavailable, idem.ErrUnknownOutcome} {
		if errors.Is(err, infra) {
			t.Fatalf("%s of damaged record %q: err = %v also matches %v: a bad record is not an infrastructure fault", what, key, err, infra)
		}
	}
	if !strings.Contains(err.Error(), key) {
		t.Fatalf("%s of damaged record %q: error %q does not name the key", what, key, err)
	}
	if c, ok := st.(errorClassifier); ok {
		got := c.ClassifyError(err)
		if !errors.Is(got, idem.ErrCorrupt) || errors.Is(got, idem.ErrUnavailable) || errors.Is(got, idem.ErrUnknownOutcome) {
			t.Fatalf("%T.ClassifyError(%v) = %v: a bad record must stay idem.ErrCorrupt", st, err, got)
		}
	}
}

// testBadRecord: a record the store cannot decode fails the operations on
// that key with idem.ErrCorrupt and nothing else: other keys are served, in
// a batch it is that entry's error while the other entries are applied (and
// held by the caller, not by nobody), and concurrent claims of other keys
// never fail because of it.
func (s *suite) testBadRecord(t *testing.T) {
	if s.feat.CorruptRecord == nil {
		t.Skip("Features.CorruptRecord unset: the store cannot hold an undecodable record")
	}
	st := s.store(t)
	ctx := ctxT(t)
	done := mustClaim(t, st, req("bad-done", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Complete", st.Complete(ctx, []byte("bad-done"), done.Record.Token, []byte("r")))
	held := mustClaim(t, st, req("bad-held", longLease, longTTL), idem.OutcomeAcquired)
	good := mustClaim(t, st, req("good-done", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Complete", st.Complete(ctx, []byte("good-done"), good.Record.Token, []byte("good")))
	goodHeld := mustClaim(t, st, req("good-held", longLease, longTTL), idem.OutcomeAcquired)
	batchExt := mustClaim(t, st, req("batch-ext", longLease, longTTL), idem.OutcomeAcquired)
	s.feat.CorruptRecord(t, st, []byte("bad-done"))
	s.feat.CorruptRecord(t, st, []byte("bad-held"))

	bad := []struct {
		key   string
		token uint64
	}{{"bad-done", done.Record.Token}, {"bad-held", held.Record.Token}}
	for _, b := range bad {
		k := []byte(b.key)
		_, err := st.Get(ctx, k)
		mustCorrupt(t, st, "Get", b.key, err)
		_, err = st.Claim(ctx, req(b.key, longLease, longTTL))
		mustCorrupt(t, st, "Claim", b.key, err)
		_, err = st.Claim(ctx, idem.ClaimRequest{Key: k, Fingerprint: []byte("fp"), Lease: longLease, TTL: longTTL})
		mustCorrupt(t, st, "Claim with a fingerprint", b.key, err)
		mustCorrupt(t, st, "Complete", b.key, st.Complete(ctx, k, b.token, []byte("x")))
		mustCorrupt(t, st, "Release", b.key, st.Release(ctx, k, b.token, "x"))
		mustCorrupt(t, st, "Fail", b.key, st.Fail(ctx, k, b.token, "x"))
		mustCorrupt(t, st, "Extend", b.key, st.Extend(ctx, k, b.token, longLease))
	}

	// The other keys are served as before.
	if r := mustGet(t, st, "good-done"); r.State != idem.StateCompleted || string(r.Result) != "good" {
		t.Fatalf("a neighbour of a damaged record: %+v", r)
	}
	if c := mustClaim(t, st, req("good-done", longLease, longTTL), idem.OutcomeCompleted); string(c.Record.Result) != "good" {
		t.Fatalf("replay next to a damaged record: %q", c.Record.Result)
	}
	fresh := mustClaim(t, st, req("fresh", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Complete next to a damaged record", st.Complete(ctx, []byte("fresh"), fresh.Record.Token, nil))

	if b, ok := st.(idem.BatchClaimer); ok {
		reqs := []idem.ClaimRequest{
			req("batch-a", longLease, longTTL), req("bad-done", longLease, longTTL), req("batch-b", longLease, longTTL),
			req("good-done", longLease, longTTL), req("bad-held", longLease, longTTL), req("batch-a", longLease, longTTL),
		}
		res, err := b.ClaimBatch(ctx, reqs)
		if err != nil {
			t.Fatalf("ClaimBatch with damaged records among its keys failed as a whole (%v): a bad record is a per-key error", err)
		}
		if len(res) != len(reqs) {
			t.Fatalf("ClaimBatch returned %d results for %d requests", len(res), len(reqs))
		}
		mustCorrupt(t, st, "ClaimBatch entry", "bad-done", res[1].Err)
		mustCorrupt(t, st, "ClaimBatch entry", "bad-held", res[4].Err)
		for i, want := range map[int]idem.Outcome{0: idem.OutcomeAcquired, 2: idem.OutcomeAcquired, 3: idem.OutcomeCompleted, 5: idem.OutcomeInProgress} {
			if res[i].Err != nil || res[i].Claim.Outcome != want {
				t.Fatalf("ClaimBatch entry %d (%q) next to damaged records: %v %s, want %s", i, reqs[i].Key, res[i].Err, res[i].Claim.Outcome, want)
			}
		}
		if string(res[3].Claim.Record.Result) != "good" {
			t.Fatalf("batch replay next to damaged records: %q", res[3].Claim.Record.Result)
		}
		// The acquired entries are held by the caller's tokens, not left in
		// progress under a token nobody has.
		for _, i := range []int{0, 2} {
			k := string(reqs[i].Key)
			if r := mustGet(t, st, k); r.State != idem.StateInProgress || r.Token != res[i].Claim.Record.Token {
				t.Fatalf("%q after the batch: %+v, want in progress with the batch's token %d", k, r, res[i].Claim.Record.Token)
			}
			mustOK(t, "Complete of a batch-acquired key", st.Complete(ctx, reqs[i].Key, res[i].Claim.Record.Token, nil))
		}
	} else if s.feat.Batch {
		t.Fatalf("Features.Batch is set but %T does not implement idem.BatchClaimer", st)
	}

	if bc, ok := st.(idem.BatchCompleter); ok {
		errs, err := bc.CompleteBatch(ctx, []idem.Completion{
			{Key: []byte("good-held"), Token: goodHeld.Record.Token, Result: []byte("ok")},
			{Key: []byte("bad-held"), Token: held.Record.Token},
			{Key: []byte("bad-done"), Token: done.Record.Token},
		})
		if err != nil {
			t.Fatalf("CompleteBatch with damaged records among its keys failed as a whole (%v): a bad record is a per-key error", err)
		}
		if len(errs) != 3 {
			t.Fatalf("CompleteBatch returned %d errors for 3 entries", len(errs))
		}
		mustOK(t, "CompleteBatch entry next to damaged records", errs[0])
		mustCorrupt(t, st, "CompleteBatch entry", "bad-held", errs[1])
		mustCorrupt(t, st, "CompleteBatch entry", "bad-done", errs[2])
		if r := mustGet(t, st, "good-held"); r.State != idem.StateCompleted || string(r.Result) != "ok" {
			t.Fatalf("good-held after CompleteBatch: %+v", r)
		}
	} else if s.feat.CompleteBatch {
		t.Fatalf("Features.CompleteBatch is set but %T does not implement idem.BatchCompleter", st)
	}

	if be, ok := st.(idem.BatchExtender); ok {
		errs, err := be.ExtendBatch(ctx, []idem.Extension{
			{Key: []byte("bad-held"), Token: held.Record.Token, Lease: longLease},
			{Key: []byte("batch-ext"), Token: batchExt.Record.Token, Lease: longLease},
			{Key: []byte("bad-done"), Token: done.Record.Token, Lease: longLease},
		})
		if err != nil {
			t.Fatalf("ExtendBatch with damaged records among its keys failed as a whole (%v): a bad record is a per-key error", err)
		}
		if len(errs) != 3 {
			t.Fatalf("ExtendBatch returned %d errors for 3 entries", len(errs))
		}
		mustCorrupt(t, st, "ExtendBatch entry", "bad-held", errs[0])
		mustOK(t, "ExtendBatch entry next to damaged records", errs[1])
		mustCorrupt(t, st, "ExtendBatch entry", "bad-done", errs[2])
		if r := mustGet(t, st, "batch-ext"); r.State != idem.StateInProgress || r.Token != batchExt.Record.Token {
			t.Fatalf("batch-ext after ExtendBatch: %+v", r)
		}
	} else if s.feat.ExtendBatch {
		t.Fatalf("Features.ExtendBatch is set but %T does not implement idem.BatchExtender", st)
	}

	s.badRecordConcurrent(t, st)

	// Nothing repaired the damaged records into fresh ones behind our back
	// (which would let a duplicate acquire the key and run its effect again).
	for _, b := range bad {
		_, err := st.Get(ctx, []byte(b.key))
		mustCorrupt(t, st, "Get at the end", b.key, err)
	}
}

// badRecordConcurrent: claims of a damaged record racing claims of other
// keys (which a store may coalesce into one round trip or one transaction)
// fail alone.
func (s *suite) badRecordConcurrent(t *testing.T, st idem.Store) {
	b, _ := st.(idem.BatchClaimer)
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 4*s.feat.Goroutines)
	const rounds = 5
	for g := 0; g < s.feat.Goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx := ctxT(t)
			for r := 0; r < rounds; r++ {
				key := fmt.Sprintf("conc-%d-%d", g, r)
				switch {
				case g%2 == 0:
					_, err := st.Claim(ctx, req("bad-done", longLease, longTTL))
					if !errors.Is(err, idem.ErrCorrupt) {
						errs <- fmt.Errorf("concurrent Claim of damaged record: %v, want idem.ErrCorrupt", err)
						return
					}
				case g%4 == 3 && b != nil:
					res, err := b.ClaimBatch(ctx, []idem.ClaimRequest{req(key, longLease, longTTL), req("bad-held", longLease, longTTL)})
					if err != nil {
						errs <- fmt.Errorf("concurrent ClaimBatch of %q and a damaged record failed as a whole: %v", key, err)
						return
					}
					if len(res) != 2 || res[0].Err != nil || res[0].Claim.Outcome != idem.OutcomeAcquired || !errors.Is(res[1].Err, idem.ErrCorrupt) {
						errs <- fmt.Errorf("concurrent ClaimBatch of %q and a damaged record: %+v", key, res)
						return
					}
				default:
					c, err := st.Claim(ctx, req(key, longLease, longTTL))
					if err != nil || c.Outcome != idem.OutcomeAcquired {
						errs <- fmt.Errorf("Claim of %q while others claim a damaged record: %s, %v; want acquired", key, c.Outcome, err)
						return
					}
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}
