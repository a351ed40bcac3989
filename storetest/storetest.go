package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// Factory returns a store serving namespace. Two stores made by one factory
// with different namespaces must share one backend (the same database,
// table, Redis or file), so that isolation is really tested. The factory
// registers its own cleanup with t.Cleanup.
type Factory func(t testing.TB, namespace string) idem.Store

// Features says what the store under test claims to support. A capability
// marked true must be implemented (the suite fails otherwise); one marked
// false is skipped with a log line.
type Features struct {
	Batch bool // idem.BatchClaimer
	// CompleteBatch: idem.BatchCompleter
	CompleteBatch bool
	// ExtendBatch: idem.BatchExtender
	ExtendBatch bool
	Purge       bool // idem.Purger
	List        bool // idem.Lister
	Stats       bool // idem.Stater
	// ForceRelease: idem.ForceReleaser (run whenever the store has it).
	ForceRelease bool
	// LeaseUnit is the base duration of the timing tests (default 100ms):
	// leases of one unit are waited out with sleeps of a few units. Raise
	// it for a store with coarse time or slow round trips.
	LeaseUnit time.Duration
	// Goroutines for contention tests (default 16).
	Goroutines int
	// LinearizabilityOps is the number of operations per worker in the
	// porcupine check (default 150, 6 workers).
	LinearizabilityOps int

	// CorruptRecord damages the stored record of key in st's namespace so
	// that the store cannot decode it (flipped bytes under a checksum, a
	// value of the wrong type, a state out of range...), bypassing the
	// store's own methods. The suite has claimed the key through st first.
	// nil: the store cannot hold an undecodable record, and BadRecordPerKey
	// is skipped with that reason.
	CorruptRecord func(t testing.TB, st idem.Store, key []byte)
	// Maintain runs one round of the store's maintenance (purge, partition
	// drops, compaction: whatever an operator or a background job runs)
	// through st. MaintenanceKeepsLiveRecords calls it in a loop on one
	// Store value while another Store value of the same namespace claims,
	// settles and reads. nil: Purge(ctx, 0) if the store is an
	// idem.Purger; otherwise the case is skipped.
	Maintain func(ctx context.Context, st idem.Store) error
	// Keys returns the i-th key of MaintenanceKeepsLiveRecords (i from 0;
	// distinct i give distinct keys). Default "maint-<i>". A time-partitioned
	// layout returns keys whose embedded time lands in old partitions, so
	// that live records sit where maintenance drops things.
	Keys func(i int) []byte
}

func (f *Features) defaults() {
	if f.LeaseUnit <= 0 {
		f.LeaseUnit = 100 * time.Millisecond
	}
	if f.Goroutines <= 0 {
		f.Goroutines = 16
	}
	if f.LinearizabilityOps <= 0 {
		f.LinearizabilityOps = 150
	}
}

const (
	longLease = time.Minute
	longTTL   = time.Hour
)

type suite struct {
	f    Factory
	feat Features
}

// Run runs the whole suite as subtests of t.
func Run(t *testing.T, f Factory, feat Features) {
	feat.defaults()
	s := &suite{f: f, feat: feat}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ClaimNewKey", s.testClaimNewKey},
		{"ExactlyOneAcquires", s.testExactlyOneAcquires},
		{"Replay", s.testReplay},
		{"CompleteIdempotent", s.testCompleteIdempotent},
		{"LeaseExpiryTakeover", s.testLeaseExpiryTakeover},
		{"ConcurrentTakeover", s.testConcurrentTakeover},
		{"Extend", s.testExtend},
		{"TTLExpiry", s.testTTLExpiry},
		{"ReleaseReclaim", s.testReleaseReclaim},
		{"Fail", s.testFail},
		{"TokensGrow", s.testTokensGrow},
		{"NotFound", s.testNotFound},
		{"Delete", s.testDelete},
		{"FingerprintMismatch", s.testFingerprint},
		{"KeyBytes", s.testKeyBytes},
		{"InvalidInputBeforeIO", s.testInvalidInput},
		{"NamespaceIsolation", s.testNamespaces},
		{"ContextCancelled", s.testContextCancelled},
		{"Batch", s.testBatch},
		{"BatchLarge", s.testBatchLarge},
		{"CompleteBatch", s.testCompleteBatch},
		{"ExtendBatch", s.testExtendBatch},
		{"Purge", s.testPurge},
		{"ListInProgress", s.testList},
		{"Stats", s.testStats},
		{"ForceRelease", s.testForceRelease},
		{"Linearizable", s.testLinearizable},
		{"BadRecordPerKey", s.testBadRecord},
		{"MaintenanceKeepsLiveRecords", s.testMaintenance},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

// NewNamespace returns a fresh namespace name, unique across runs, so tests
// on shared servers never see each other's records.
func NewNamespace() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:])
}

func (s *suite) store(t *testing.T) idem.Store { return s.f(t, NewNamespace()) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func req(key string, lease, ttl time.Duration) idem.ClaimRequest {
	return idem.ClaimRequest{Key: []byte(key), Lease: lease, TTL: ttl}
}

func mustClaim(t testing.TB, st idem.Store, r idem.ClaimRequest, want idem.Outcome) idem.Claim {
	t.Helper()
	c, err := st.Claim(ctxT(t), r)
	if err != nil {
		t.Fatalf("Claim(%q): %v", r.Key, err)
	}
	if c.Outcome != want {
		t.Fatalf("Claim(%q) = %s, want %s (record %+v)", r.Key, c.Outcome, want, c.Record)
	}
	return c
}

func mustIs(t testing.TB, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}

func mustOK(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func mustGet(t testing.TB, st idem.Store, key string) idem.Record {
	t.Helper()
	r, err := st.Get(ctxT(t), []byte(key))
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	if string(r.Key) != key {
		t.Fatalf("Get(%q).Key = %q", key, r.Key)
	}
	return r
}

func (s *suite) testClaimNewKey(t *testing.T) {
	st := s.store(t)
	before := time.Now()
	c := mustClaim(t, st, idem.ClaimRequest{Key: []byte("order-1"), Fingerprint: []byte("fp"), Lease: longLease, TTL: longTTL}, idem.OutcomeAcquired)
	r := c.Record
	if r.Token == 0 || r.State != idem.StateInProgress || r.Attempts != 1 || !bytes.Equal(r.Fingerprint, []byte("fp")) {
		t.Fatalf("acquired record %+v", r)
	}
	near(t, "LeaseUntil", r.LeaseUntil, before.Add(longLease))
	near(t, "ExpiresAt", r.ExpiresAt, before.Add(longTTL))
	g := mustGet(t, st, "order-1")
	if g.Token != r.Token || g.State != idem.StateInProgress || g.Attempts != 1 || len(g.Result) != 0 {
		t.Fatalf("Get after claim = %+v, want token %d in progress", g, r.Token)
	}
	c2 := mustClaim(t, st, req("order-1", longLease, longTTL), idem.OutcomeInProgress)
	near(t, "InProgress LeaseUntil", c2.Record.LeaseUntil, before.Add(longLease))
}

// near allows for clock skew between the test and a server clock.
func near(t testing.TB, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("%s = %s, want about %s", what, got, want)
	}
}

func (s *suite) testExactlyOneAcquires(t *testing.T) {
	st := s.store(t)
	const keys = 10
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("contended-%d", k)
		results, errs := s.claimAtOnce(t, st, key)
		acquired := 0
		var token uint64
		for g := range results {
			if errs[g] != nil {
				t.Fatalf("claim %d of %q: %v", g, key, errs[g])
			}
			switch results[g].Outcome {
			case idem.OutcomeAcquired:
				acquired++
				token = results[g].Record.Token
			case idem.OutcomeInProgress:
			default:
				t.Fatalf("claim %d of %q: outcome %s", g, key, results[g].Outcome)
			}
		}
		if acquired != 1 {
			t.Fatalf("%d goroutines acquired %q, want exactly 1", acquired, key)
		}
		if r := mustGet(t, st, key); r.Token != token || r.Attempts != 1 {
			t.Fatalf("record %+v, want token %d attempts 1", r, token)
		}
	}
}

// claimAtOnce has Features.Goroutines goroutines claim key at the same
// moment and returns each one's answer.
func (s *suite) claimAtOnce(t *testing.T, st idem.Store, key string) ([]idem.Claim, []error) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	res := make([]idem.Claim, s.feat.Goroutines)
	errs := make([]error, s.feat.Goroutines)
	for g := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res[g], errs[g] = st.Claim(ctxT(t), req(key, longLease, longTTL))
		}()
	}
	close(start)
	wg.Wait()
	return res, errs
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func (s *suite) testReplay(t *testing.T) {
	st := s.store(t)
	cases := []struct {
		name   string
		result []byte
	}{
		{"nil", nil},
		{"empty", []byte{}},
		{"text", []byte(`{"status":"paid","amount":100}`)},
		{"binary", []byte{0, 0xff, 0xfe, 0, '\n', 0x80}},
		{"64KiB", randomBytes(64 << 10)},
		{"max", randomBytes(idem.MaxResultLen)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := "replay-" + tc.name
			c := mustClaim(t, st, req(key, longLease, longTTL), idem.OutcomeAcquired)
			mustOK(t, "Complete", st.Complete(ctxT(t), []byte(key), c.Record.Token, tc.result))
			for i := 0; i < 2; i++ {
				r := mustClaim(t, st, req(key, longLease, longTTL), idem.OutcomeCompleted)
				if !bytes.Equal(r.Record.Result, tc.result) {
					t.Fatalf("replayed %d bytes, want the %d stored bytes exactly", len(r.Record.Result), len(tc.result))
				}
				if r.Record.State != idem.StateCompleted || r.Record.Token != c.Record.Token {
					t.Fatalf("replay record %+v", r.Record)
				}
			}
			g := mustGet(t, st, key)
			if !bytes.Equal(g.Result, tc.result) || g.State != idem.StateCompleted {
				t.Fatalf("Get after complete: state %s, %d result bytes", g.State, len(g.Result))
			}
		})
	}
	t.Run("TooLarge", func(t *testing.T) {
		c := mustClaim(t, st, req("replay-too-large", longLease, longTTL), idem.OutcomeAcquired)
		mustIs(t, "Complete with result over MaxResultLen", st.Complete(ctxT(t), []byte("replay-too-large"), c.Record.Token, make([]byte, idem.MaxResultLen+1)), idem.ErrInvalidArgument)
		if r := mustGet(t, st, "replay-too-large"); r.State != idem.StateInProgress {
			t.Fatalf("rejected Complete changed the record: %+v", r)
		}
	})
}

func (s *suite) testCompleteIdempotent(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	c := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	tok := c.Record.Token
	mustOK(t, "Complete", st.Complete(ctx, []byte("k"), tok, []byte("first")))
	mustOK(t, "Complete again with the same token", st.Complete(ctx, []byte("k"), tok, []byte("second")))
	if r := mustGet(t, st, "k"); string(r.Result) != "first" {
		t.Fatalf("second Complete overwrote the result: %q", r.Result)
	}
	mustIs(t, "Release after Complete", st.Release(ctx, []byte("k"), tok, ""), idem.ErrFenced)
	mustIs(t, "Fail after Complete", st.Fail(ctx, []byte("k"), tok, "x"), idem.ErrFenced)
	mustIs(t, "Extend after Complete", st.Extend(ctx, []byte("k"), tok, longLease), idem.ErrFenced)
	mustIs(t, "Complete with another token", st.Complete(ctx, []byte("k"), tok+1000, nil), idem.ErrFenced)
	if r := mustGet(t, st, "k"); r.State != idem.StateCompleted || string(r.Result) != "first" {
		t.Fatalf("fenced calls changed the record: %+v", r)
	}
}

func (s *suite) testLeaseExpiryTakeover(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	u := s.feat.LeaseUnit
	old := mustClaim(t, st, req("k", u, longTTL), idem.OutcomeAcquired)
	time.Sleep(3 * u)
	nw := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	if nw.Record.Token <= old.Record.Token {
		t.Fatalf("takeover token %d not greater than %d", nw.Record.Token, old.Record.Token)
	}
	if nw.Record.Attempts != 2 {
		t.Fatalf("attempts after takeover = %d, want 2", nw.Record.Attempts)
	}
	k, ot := []byte("k"), old.Record.Token
	mustIs(t, "stale Complete", st.Complete(ctx, k, ot, []byte("stale")), idem.ErrFenced)
	mustIs(t, "stale Release", st.Release(ctx, k, ot, "stale"), idem.ErrFenced)
	mustIs(t, "stale Fail", st.Fail(ctx, k, ot, "stale"), idem.ErrFenced)
	mustIs(t, "stale Extend", st.Extend(ctx, k, ot, longLease), idem.ErrFenced)
	r := mustGet(t, st, "k")
	if r.Token != nw.Record.Token || r.State != idem.StateInProgress || len(r.Result) != 0 || r.LastError != "" {
		t.Fatalf("stale calls changed the record: %+v", r)
	}
	mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeInProgress)
	mustOK(t, "Complete with the new token", st.Complete(ctx, k, nw.Record.Token, []byte("new")))
	if c := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeCompleted); string(c.Record.Result) != "new" {
		t.Fatalf("result %q", c.Record.Result)
	}

	// A holder whose lease lapsed but was not taken over may still complete.
	late := mustClaim(t, st, req("late", u, longTTL), idem.OutcomeAcquired)
	time.Sleep(2 * u)
	mustOK(t, "Complete after the lease lapsed, no takeover", st.Complete(ctx, []byte("late"), late.Record.Token, []byte("ok")))
}

func (s *suite) testConcurrentTakeover(t *testing.T) {
	st := s.store(t)
	u := s.feat.LeaseUnit
	for k := 0; k < 3; k++ {
		key := fmt.Sprintf("expired-%d", k)
		first := mustClaim(t, st, req(key, u, longTTL), idem.OutcomeAcquired)
		time.Sleep(2 * u)
		res, errs := s.claimAtOnce(t, st, key)
		n := 0
		for g := range res {
			mustOK(t, "concurrent takeover claim", errs[g])
			if res[g].Outcome == idem.OutcomeAcquired {
				n++
				if res[g].Record.Token <= first.Record.Token {
					t.Fatalf("takeover token %d <= %d", res[g].Record.Token, first.Record.Token)
				}
			} else if res[g].Outcome != idem.OutcomeInProgress {
				t.Fatalf("outcome %s", res[g].Outcome)
			}
		}
		if n != 1 {
			t.Fatalf("%d goroutines took over %q, want exactly 1", n, key)
		}
	}
}

func (s *suite) testExtend(t *testing.T) {
	s.withUnit(t, func(t *testing.T, u time.Duration) error {
		st := s.store(t)
		ctx := ctxT(t)
		c := mustClaim(t, st, req("k", 2*u, longTTL), idem.OutcomeAcquired)
		extended := time.Now()
		mustOK(t, "Extend", st.Extend(ctx, []byte("k"), c.Record.Token, 20*u))
		time.Sleep(4 * u)
		if err := inProgressUnless(t, st, "k", extended, 20*u); err != nil {
			return err
		}
		r := mustGet(t, st, "k")
		if !r.ExpiresAt.After(r.LeaseUntil) && !r.ExpiresAt.Equal(r.LeaseUntil) {
			t.Fatalf("ExpiresAt %s before LeaseUntil %s", r.ExpiresAt, r.LeaseUntil)
		}
		// Extending past the TTL keeps the record alive at least as long as the lease.
		claimed := time.Now()
		c2 := mustClaim(t, st, req("short-ttl", u, 2*u), idem.OutcomeAcquired)
		extended = time.Now()
		if err := st.Extend(ctx, []byte("short-ttl"), c2.Record.Token, 30*u); err != nil {
			if late(err, claimed, 2*u) {
				return lateErr("Extend of a record with a TTL of %s", 2*u)
			}
			t.Fatalf("Extend beyond TTL: %v", err)
		}
		time.Sleep(4 * u)
		return inProgressUnless(t, st, "short-ttl", extended, 30*u)
	})
}

func (s *suite) testTTLExpiry(t *testing.T) {
	s.withUnit(t, func(t *testing.T, u time.Duration) error {
		st := s.store(t)
		ctx := ctxT(t)
		claimed := time.Now()
		c := mustClaim(t, st, req("k", u, 2*u), idem.OutcomeAcquired)
		completed := time.Now()
		if err := st.Complete(ctx, []byte("k"), c.Record.Token, []byte("r")); err != nil {
			if late(err, claimed, 2*u) {
				return lateErr("Complete of a record with a TTL of %s", 2*u)
			}
			t.Fatalf("Complete: %v", err)
		}
		again, err := st.Claim(ctx, req("k", u, 2*u))
		mustOK(t, "Claim of a completed key", err)
		if again.Outcome != idem.OutcomeCompleted {
			if again.Outcome == idem.OutcomeAcquired && !time.Now().Before(completed.Add(2*u)) {
				return lateErr("claim of a record completed with a TTL of %s", 2*u)
			}
			t.Fatalf("Claim of a completed key = %s, want completed (record %+v)", again.Outcome, again.Record)
		}
		keep := mustClaim(t, st, req("keep", longLease, longTTL), idem.OutcomeAcquired)
		time.Sleep(4 * u)
		_, err = st.Get(ctx, []byte("k"))
		mustIs(t, "Get after TTL", err, idem.ErrNotFound)
		mustIs(t, "Complete after TTL", st.Complete(ctx, []byte("k"), c.Record.Token, nil), idem.ErrNotFound)
		n := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
		if n.Record.Token <= c.Record.Token || n.Record.Attempts != 1 {
			t.Fatalf("claim after expiry: token %d (old %d), attempts %d; want a larger token and a fresh record", n.Record.Token, c.Record.Token, n.Record.Attempts)
		}
		if r := mustGet(t, st, "keep"); r.Token != keep.Record.Token {
			t.Fatalf("unexpired record changed: %+v", r)
		}
		return nil
	})
}

// errLate: the machine was slower than a case's short lease or TTL. A
// record the case relies on may have expired, legitimately, before its next
// operation reached the store: no verdict on the store.
var errLate = errors.New("storetest: slower than the lease unit")

func lateErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format+" came after it may have expired", append([]any{errLate}, args...)...)
}

// late reports whether err is a not-found that the record's life may
// explain: the call returned after since+life on the test's clock (the
// record was written after since, so it lived at least until then).
func late(err error, since time.Time, life time.Duration) bool {
	return errors.Is(err, idem.ErrNotFound) && !time.Now().Before(since.Add(life))
}

// inProgressUnless checks that claiming key finds it in progress, unless
// the claim came after since+lease (the lease, extended after since, may
// have ended on a slow machine: errLate).
func inProgressUnless(t *testing.T, st idem.Store, key string, since time.Time, lease time.Duration) error {
	t.Helper()
	c, err := st.Claim(ctxT(t), req(key, longLease, longTTL))
	mustOK(t, fmt.Sprintf("Claim(%q)", key), err)
	if c.Outcome == idem.OutcomeInProgress {
		return nil
	}
	if c.Outcome == idem.OutcomeAcquired && !time.Now().Before(since.Add(lease)) {
		return lateErr("claim of %q within a lease of %s", key, lease)
	}
	t.Fatalf("Claim(%q) = %s, want in progress (record %+v)", key, c.Outcome, c.Record)
	return nil
}

// withUnit runs a case built on short leases and TTLs with the suite's
// lease unit; when it reports errLate (the machine was slower than the
// unit), it runs again, on a fresh store, with the unit doubled, up to 8
// times the suite's. Only a store's answer within its promised times is
// ever judged.
func (s *suite) withUnit(t *testing.T, fn func(t *testing.T, u time.Duration) error) {
	t.Helper()
	u := s.feat.LeaseUnit
	for try := 0; ; try++ {
		err := fn(t, u)
		if err == nil {
			return
		}
		if !errors.Is(err, errLate) || try == 3 {
			t.Fatalf("%v (lease unit %s)", err, u)
		}
		t.Logf("%v; again with a lease unit of %s", err, 2*u)
		u *= 2
	}
}

func (s *suite) testReleaseReclaim(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	k := []byte("k")
	c := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Release", st.Release(ctx, k, c.Record.Token, "downstream timeout"))
	mustOK(t, "Release again", st.Release(ctx, k, c.Record.Token, "downstream timeout"))
	r := mustGet(t, st, "k")
	if r.State != idem.StateReleased || r.LastError != "downstream timeout" || r.Token != c.Record.Token {
		t.Fatalf("after release: %+v", r)
	}
	mustIs(t, "Complete after Release", st.Complete(ctx, k, c.Record.Token, nil), idem.ErrFenced)
	mustIs(t, "Extend after Release", st.Extend(ctx, k, c.Record.Token, longLease), idem.ErrFenced)
	c2 := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	if c2.Record.Token <= c.Record.Token || c2.Record.Attempts != 2 {
		t.Fatalf("re-claim: token %d (old %d), attempts %d", c2.Record.Token, c.Record.Token, c2.Record.Attempts)
	}
	mustIs(t, "old token after re-claim", st.Release(ctx, k, c.Record.Token, ""), idem.ErrFenced)
	mustOK(t, "Release without cause", st.Release(ctx, k, c2.Record.Token, ""))
	if r := mustGet(t, st, "k"); r.LastError != "downstream timeout" {
		t.Fatalf("Release with empty cause erased LastError: %q", r.LastError)
	}
	c3 := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Complete", st.Complete(ctx, k, c3.Record.Token, []byte("done")))
	if r := mustGet(t, st, "k"); r.Attempts != 3 || r.State != idem.StateCompleted {
		t.Fatalf("final record %+v", r)
	}
}

func (s *suite) testFail(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	k := []byte("poison")
	c := mustClaim(t, st, req("poison", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Fail", st.Fail(ctx, k, c.Record.Token, "unparseable payload"))
	mustOK(t, "Fail again", st.Fail(ctx, k, c.Record.Token, "unparseable payload"))
	f := mustClaim(t, st, req("poison", longLease, longTTL), idem.OutcomeFailed)
	if f.Record.LastError != "unparseable payload" || f.Record.State != idem.StateFailed {
		t.Fatalf("failed claim record %+v", f.Record)
	}
	mustIs(t, "Complete after Fail", st.Complete(ctx, k, c.Record.Token, nil), idem.ErrFenced)
	mustIs(t, "Release after Fail", st.Release(ctx, k, c.Record.Token, ""), idem.ErrFenced)
	mustClaim(t, st, req("poison", longLease, longTTL), idem.OutcomeFailed)
}

func (s *suite) testTokensGrow(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	var last uint64
	for i := 0; i < 20; i++ {
		c := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
		if c.Record.Token <= last {
			t.Fatalf("claim %d: token %d not greater than %d", i, c.Record.Token, last)
		}
		last = c.Record.Token
		mustOK(t, "Release", st.Release(ctx, []byte("k"), last, ""))
	}
}

func (s *suite) testNotFound(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	k := []byte("never-claimed")
	_, err := st.Get(ctx, k)
	mustIs(t, "Get", err, idem.ErrNotFound)
	mustIs(t, "Complete", st.Complete(ctx, k, 1, nil), idem.ErrNotFound)
	mustIs(t, "Release", st.Release(ctx, k, 1, ""), idem.ErrNotFound)
	mustIs(t, "Fail", st.Fail(ctx, k, 1, ""), idem.ErrNotFound)
	mustIs(t, "Extend", st.Extend(ctx, k, 1, time.Second), idem.ErrNotFound)
	_, err = st.Get(ctx, k)
	mustIs(t, "Get after the calls", err, idem.ErrNotFound)
}

func (s *suite) testDelete(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	k := []byte("k")
	c := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Complete", st.Complete(ctx, k, c.Record.Token, []byte("x")))
	mustOK(t, "Delete", st.Delete(ctx, k))
	_, err := st.Get(ctx, k)
	mustIs(t, "Get after Delete", err, idem.ErrNotFound)
	mustOK(t, "Delete of an absent key", st.Delete(ctx, k))
	c2 := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	if c2.Record.Token <= c.Record.Token {
		t.Fatalf("token after Delete %d not greater than %d", c2.Record.Token, c.Record.Token)
	}
	// A holder of a deleted claim is refused.
	mustOK(t, "Delete held", st.Delete(ctx, k))
	mustIs(t, "Complete of a deleted claim", st.Complete(ctx, k, c2.Record.Token, nil), idem.ErrNotFound)
}

func (s *suite) testFingerprint(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	a, b := []byte("fp-a"), []byte("fp-b")
	fr := func(key string, fp []byte) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(key), Fingerprint: fp, Lease: longLease, TTL: longTTL}
	}
	c := mustClaim(t, st, fr("k", a), idem.OutcomeAcquired)
	_, err := st.Claim(ctx, fr("k", b))
	mustIs(t, "other fingerprint while in progress", err, idem.ErrFingerprintMismatch)
	mustClaim(t, st, fr("k", a), idem.OutcomeInProgress)
	mustClaim(t, st, fr("k", nil), idem.OutcomeInProgress)
	mustOK(t, "Complete", st.Complete(ctx, []byte("k"), c.Record.Token, []byte("result-a")))
	_, err = st.Claim(ctx, fr("k", b))
	mustIs(t, "other fingerprint after completion", err, idem.ErrFingerprintMismatch)
	if r := mustClaim(t, st, fr("k", a), idem.OutcomeCompleted); string(r.Record.Result) != "result-a" || !bytes.Equal(r.Record.Fingerprint, a) {
		t.Fatalf("replay %+v", r.Record)
	}
	// Fingerprints are compared as bytes, case-sensitively.
	_, err = st.Claim(ctx, fr("k", []byte("FP-A")))
	mustIs(t, "fingerprint differing in case", err, idem.ErrFingerprintMismatch)
	// A released key keeps its fingerprint.
	c2 := mustClaim(t, st, fr("k2", a), idem.OutcomeAcquired)
	mustOK(t, "Release", st.Release(ctx, []byte("k2"), c2.Record.Token, ""))
	_, err = st.Claim(ctx, fr("k2", b))
	mustIs(t, "other fingerprint after release", err, idem.ErrFingerprintMismatch)
	if r := mustGet(t, st, "k2"); r.State != idem.StateReleased {
		t.Fatalf("mismatched claim changed the record: %+v", r)
	}
	// Too long a fingerprint is refused.
	_, err = st.Claim(ctx, fr("k3", make([]byte, idem.MaxFingerprintLen+1)))
	mustIs(t, "fingerprint over the limit", err, idem.ErrInvalidArgument)
	mustClaim(t, st, fr("k3", bytes.Repeat([]byte{0xff}, idem.MaxFingerprintLen)), idem.OutcomeAcquired)
}

// EdgeKeys are keys that are all distinct as raw bytes and that a careless
// store would conflate (collations, NUL-terminated strings, UTF-8 decoding).
func EdgeKeys() [][]byte {
	return [][]byte{
		[]byte("a"), []byte("A"), []byte("a "), []byte("a  "), []byte(" a"),
		[]byte("a\x00"), []byte("a\x00b"), []byte("a\x00c"), []byte("\x00"), []byte("\x00\x00"),
		{0xff}, {0xff, 0xfe}, {0xc3, 0x28}, []byte("é"), []byte("e\u0301"), []byte("ß"), []byte("ss"),
		[]byte("k\n"), []byte("k\r\n"), []byte("k\t"), []byte("%"), []byte("_"), []byte("*"), []byte("{tag}"),
		[]byte("'; DROP TABLE x; --"), bytes.Repeat([]byte("x"), idem.MaxKeyLen),
		append(bytes.Repeat([]byte("x"), idem.MaxKeyLen-1), 'y'), bytes.Repeat([]byte{0}, idem.MaxKeyLen),
	}
}

func (s *suite) testKeyBytes(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	keys := EdgeKeys()
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[string(k)] {
			t.Fatalf("EdgeKeys has a duplicate %q", k)
		}
		seen[string(k)] = true
	}
	tokens := make([]uint64, len(keys))
	for i, k := range keys {
		c, err := st.Claim(ctx, idem.ClaimRequest{Key: k, Lease: longLease, TTL: longTTL})
		mustOK(t, fmt.Sprintf("Claim(%q)", k), err)
		if c.Outcome != idem.OutcomeAcquired {
			t.Fatalf("Claim(%q) = %s: the store conflated it with another key", k, c.Outcome)
		}
		tokens[i] = c.Record.Token
	}
	for i, k := range keys {
		mustOK(t, fmt.Sprintf("Complete(%q)", k), st.Complete(ctx, k, tokens[i], []byte(fmt.Sprintf("result-%d", i))))
	}
	for i, k := range keys {
		r, err := st.Get(ctx, k)
		mustOK(t, fmt.Sprintf("Get(%q)", k), err)
		if !bytes.Equal(r.Key, k) || string(r.Result) != fmt.Sprintf("result-%d", i) {
			t.Fatalf("Get(%q) = key %q result %q, want result-%d", k, r.Key, r.Result, i)
		}
	}
}

func (s *suite) testInvalidInput(t *testing.T) {
	st := s.store(t)
	// A cancelled context proves validation comes before any I/O: the
	// validation error must win over the context error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	long := bytes.Repeat([]byte("k"), idem.MaxKeyLen+1)
	for _, k := range [][]byte{nil, {}, long} {
		name := fmt.Sprintf("key of %d bytes", len(k))
		_, err := st.Claim(ctx, idem.ClaimRequest{Key: k, Lease: time.Second, TTL: time.Second})
		mustIs(t, name+": Claim", err, idem.ErrInvalidKey)
		mustIs(t, name+": Complete", st.Complete(ctx, k, 1, nil), idem.ErrInvalidKey)
		mustIs(t, name+": Release", st.Release(ctx, k, 1, ""), idem.ErrInvalidKey)
		mustIs(t, name+": Fail", st.Fail(ctx, k, 1, ""), idem.ErrInvalidKey)
		mustIs(t, name+": Extend", st.Extend(ctx, k, 1, time.Second), idem.ErrInvalidKey)
		_, err = st.Get(ctx, k)
		mustIs(t, name+": Get", err, idem.ErrInvalidKey)
		mustIs(t, name+": Delete", st.Delete(ctx, k), idem.ErrInvalidKey)
	}
	k := []byte("k")
	for _, tc := range []struct {
		name       string
		lease, ttl time.Duration
	}{
		{"zero lease", 0, time.Second}, {"negative lease", -time.Second, time.Second},
		{"absurd lease", idem.MaxLease + time.Second, time.Hour}, {"zero ttl", time.Second, 0},
		{"negative ttl", time.Second, -1}, {"absurd ttl", time.Second, idem.MaxTTL + time.Hour},
	} {
		_, err := st.Claim(ctx, idem.ClaimRequest{Key: k, Lease: tc.lease, TTL: tc.ttl})
		mustIs(t, tc.name, err, idem.ErrInvalidArgument)
	}
	mustIs(t, "token 0", st.Complete(ctx, k, 0, nil), idem.ErrInvalidArgument)
	mustIs(t, "Extend with zero lease", st.Extend(ctx, k, 1, 0), idem.ErrInvalidArgument)
	mustIs(t, "cause over the limit", st.Release(ctx, k, 1, strings.Repeat("x", idem.MaxCauseLen+1)), idem.ErrInvalidArgument)
	mustIs(t, "result over the limit", st.Complete(ctx, k, 1, make([]byte, idem.MaxResultLen+1)), idem.ErrInvalidArgument)
	_, err := st.Get(context.Background(), k)
	mustIs(t, "nothing stored by rejected calls", err, idem.ErrNotFound)
}

func (s *suite) testNamespaces(t *testing.T) {
	a, b := s.f(t, NewNamespace()), s.f(t, NewNamespace())
	ctx := ctxT(t)
	k := []byte("shared-key")
	ca := mustClaim(t, a, req("shared-key", longLease, longTTL), idem.OutcomeAcquired)
	cb := mustClaim(t, b, req("shared-key", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Complete in a", a.Complete(ctx, k, ca.Record.Token, []byte("from-a")))
	if r := mustGet(t, b, "shared-key"); r.State != idem.StateInProgress {
		t.Fatalf("completing in namespace a changed b: %+v", r)
	}
	if cb.Record.Token != ca.Record.Token {
		// Tokens may coincide across namespaces; a token from one namespace
		// must not settle the other's record when they differ.
		mustIs(t, "a's token in b", b.Complete(ctx, k, ca.Record.Token, nil), idem.ErrFenced)
	}
	mustOK(t, "Complete in b", b.Complete(ctx, k, cb.Record.Token, []byte("from-b")))
	if r := mustGet(t, a, "shared-key"); string(r.Result) != "from-a" {
		t.Fatalf("a's result = %q", r.Result)
	}
	mustOK(t, "Delete in a", a.Delete(ctx, k))
	if r := mustGet(t, b, "shared-key"); string(r.Result) != "from-b" {
		t.Fatalf("deleting in a removed b's record: %+v", r)
	}
	mustClaim(t, a, req("only-a", longLease, longTTL), idem.OutcomeAcquired)
	_, err := b.Get(ctx, []byte("only-a"))
	mustIs(t, "b sees a's key", err, idem.ErrNotFound)
	if s.feat.List {
		recs, _ := listAll(t, b)
		for _, r := range recs {
			if string(r.Key) == "only-a" {
				t.Fatalf("ListInProgress in b returned a's key")
			}
		}
	}
}

func (s *suite) testContextCancelled(t *testing.T) {
	st := s.store(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k := []byte("k")
	_, err := st.Claim(ctx, req("k", longLease, longTTL))
	mustIs(t, "Claim", err, context.Canceled)
	_, err = st.Get(context.Background(), k)
	mustIs(t, "a cancelled Claim stored nothing", err, idem.ErrNotFound)
	c := mustClaim(t, st, req("k", longLease, longTTL), idem.OutcomeAcquired)
	mustIs(t, "Complete", st.Complete(ctx, k, c.Record.Token, nil), context.Canceled)
	mustIs(t, "Release", st.Release(ctx, k, c.Record.Token, ""), context.Canceled)
	mustIs(t, "Fail", st.Fail(ctx, k, c.Record.Token, ""), context.Canceled)
	mustIs(t, "Extend", st.Extend(ctx, k, c.Record.Token, time.Second), context.Canceled)
	_, err = st.Get(ctx, k)
	mustIs(t, "Get", err, context.Canceled)
	mustIs(t, "Delete", st.Delete(ctx, k), context.Canceled)
	if r := mustGet(t, st, "k"); r.State != idem.StateInProgress || r.Token != c.Record.Token {
		t.Fatalf("cancelled calls changed the record: %+v", r)
	}
	if b, ok := st.(idem.BatchClaimer); ok {
		_, err := b.ClaimBatch(ctx, []idem.ClaimRequest{req("b", longLease, longTTL)})
		mustIs(t, "ClaimBatch", err, context.Canceled)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel2()
	time.Sleep(time.Millisecond)
	_, err = st.Claim(ctx2, req("k2", longLease, longTTL))
	mustIs(t, "Claim past its deadline", err, context.DeadlineExceeded)
}

func (s *suite) batcher(t *testing.T, st idem.Store) idem.BatchClaimer {
	b, ok := st.(idem.BatchClaimer)
	if !ok {
		if s.feat.Batch {
			t.Fatalf("Features.Batch is set but %T does not implement idem.BatchClaimer", st)
		}
		t.Skip("store does not implement idem.BatchClaimer (Features.Batch unset)")
	}
	return b
}

func (s *suite) testBatch(t *testing.T) {
	st := s.store(t)
	b := s.batcher(t, st)
	ctx := ctxT(t)
	done := mustClaim(t, st, req("done", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Complete", st.Complete(ctx, []byte("done"), done.Record.Token, []byte("stored")))
	mustClaim(t, st, idem.ClaimRequest{Key: []byte("busy"), Fingerprint: []byte("fa"), Lease: longLease, TTL: longTTL}, idem.OutcomeAcquired)
	failed := mustClaim(t, st, req("failed", longLease, longTTL), idem.OutcomeAcquired)
	mustOK(t, "Fail", st.Fail(ctx, []byte("failed"), failed.Record.Token, "bad"))

	reqs := []idem.ClaimRequest{
		req("new-1", longLease, longTTL),
		req("new-2", longLease, longTTL),
		req("new-1", longLease, longTTL),
		req("done", longLease, longTTL),
		req("busy", longLease, longTTL),
		{Key: nil, Lease: longLease, TTL: longTTL},
		{Key: []byte("busy"), Fingerprint: []byte("fb"), Lease: longLease, TTL: longTTL},
		req("failed", longLease, longTTL),
		{Key: []byte("bad-lease"), Lease: 0, TTL: longTTL},
		{Key: []byte("new-3"), Fingerprint: []byte("x"), Lease: longLease, TTL: longTTL},
		{Key: []byte("new-3"), Fingerprint: []byte("y"), Lease: longLease, TTL: longTTL},
	}
	want := []struct {
		outcome idem.Outcome
		err     error
	}{
		{idem.OutcomeAcquired, nil}, {idem.OutcomeAcquired, nil}, {idem.OutcomeInProgress, nil},
		{idem.OutcomeCompleted, nil}, {idem.OutcomeInProgress, nil}, {0, idem.ErrInvalidKey},
		{0, idem.ErrFingerprintMismatch}, {idem.OutcomeFailed, nil}, {0, idem.ErrInvalidArgument},
		{idem.OutcomeAcquired, nil}, {0, idem.ErrFingerprintMismatch},
	}
	res, err := b.ClaimBatch(ctx, reqs)
	mustOK(t, "ClaimBatch", err)
	if len(res) != len(reqs) {
		t.Fatalf("ClaimBatch returned %d results for %d requests", len(res), len(reqs))
	}
	for i, w := range want {
		if w.err != nil {
			mustIs(t, fmt.Sprintf("entry %d (%q)", i, reqs[i].Key), res[i].Err, w.err)
			continue
		}
		mustOK(t, fmt.Sprintf("entry %d (%q)", i, reqs[i].Key), res[i].Err)
		if res[i].Claim.Outcome != w.outcome {
			t.Fatalf("entry %d (%q) = %s, want %s", i, reqs[i].Key, res[i].Claim.Outcome, w.outcome)
		}
	}
	if string(res[3].Claim.Record.Result) != "stored" {
		t.Fatalf("batch replay result %q", res[3].Claim.Record.Result)
	}
	if res[7].Claim.Record.LastError != "bad" {
		t.Fatalf("batch failed record %+v", res[7].Claim.Record)
	}
	if res[2].Claim.Record.Token != 0 && res[2].Claim.Record.Token != res[0].Claim.Record.Token {
		t.Fatalf("second entry of new-1 reports token %d, first acquired %d", res[2].Claim.Record.Token, res[0].Claim.Record.Token)
	}
	for _, i := range []int{0, 1, 9} {
		mustOK(t, "Complete batch-acquired key", st.Complete(ctx, reqs[i].Key, res[i].Claim.Record.Token, []byte("ok")))
	}
	if _, err := st.Get(ctx, []byte("bad-lease")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("invalid batch entry stored a record: %v", err)
	}
	empty, err := b.ClaimBatch(ctx, nil)
	mustOK(t, "empty ClaimBatch", err)
	if len(empty) != 0 {
		t.Fatalf("empty batch returned %d results", len(empty))
	}
}

func (s *suite) testBatchLarge(t *testing.T) {
	st := s.store(t)
	b := s.batcher(t, st)
	ctx := ctxT(t)
	const n = 500
	reqs := make([]idem.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = req(fmt.Sprintf("bulk-%04d", i), longLease, longTTL)
	}
	res, err := b.ClaimBatch(ctx, reqs)
	mustOK(t, "ClaimBatch", err)
	for i := range res {
		if res[i].Err != nil || res[i].Claim.Outcome != idem.OutcomeAcquired {
			t.Fatalf("entry %d: %v %s", i, res[i].Err, res[i].Claim.Outcome)
		}
		if i%2 == 0 {
			mustOK(t, "Complete", st.Complete(ctx, reqs[i].Key, res[i].Claim.Record.Token, []byte(reqs[i].Key)))
		}
	}
	res, err = b.ClaimBatch(ctx, reqs)
	mustOK(t, "second ClaimBatch", err)
	for i := range res {
		want := idem.OutcomeInProgress
		if i%2 == 0 {
			want = idem.OutcomeCompleted
		}
		if res[i].Err != nil || res[i].Claim.Outcome != want {
			t.Fatalf("entry %d again: %v %s, want %s", i, res[i].Err, res[i].Claim.Outcome, want)
		}
		if want == idem.OutcomeCompleted && !bytes.Equal(res[i].Claim.Record.Result, reqs[i].Key) {
			t.Fatalf("entry %d replayed %q", i, res[i].Claim.Record.Result)
		}
	}
}

func (s *suite) testPurge(t *testing.T) {
	st := s.store(t)
	p, ok := st.(idem.Purger)
	if !ok {
		if s.feat.Purge {
			t.Fatalf("Features.Purge is set but %T does not implement idem.Purger", st)
		}
		t.Skip("no idem.Purger")
	}
	ctx := ctxT(t)
	u := s.feat.LeaseUnit
	const short, long = 20, 5
	// Half the short-lived records expire in progress (nothing to settle in
	// time); the other half are completed within their TTL. On a machine
	// slower than that the Complete may find the record expired: then it
	// is one more expired in-progress record, which is what the case needs.
	for i := 0; i < short; i++ {
		k := fmt.Sprintf("short-%d", i)
		if i%2 == 0 {
			mustClaim(t, st, req(k, u, u), idem.OutcomeAcquired)
			continue
		}
		claimed := time.Now()
		c := mustClaim(t, st, req(k, u, 4*u), idem.OutcomeAcquired)
		if err := st.Complete(ctx, []byte(k), c.Record.Token, nil); err != nil && !late(err, claimed, 4*u) {
			t.Fatalf("Complete(%q): %v", k, err)
		}
	}
	for i := 0; i < long; i++ {
		k := fmt.Sprintf("long-%d", i)
		c := mustClaim(t, st, req(k, longLease, longTTL), idem.OutcomeAcquired)
		mustOK(t, "Complete", st.Complete(ctx, []byte(k), c.Record.Token, nil))
	}
	time.Sleep(6 * u)
	n1, err := p.Purge(ctx, 3)
	mustOK(t, "Purge(3)", err)
	if n1 < 0 || n1 > 3 {
		t.Fatalf("Purge(limit 3) removed %d", n1)
	}
	n2, err := p.Purge(ctx, 0)
	mustOK(t, "Purge(0)", err)
	if n1+n2 > short {
		t.Fatalf("Purge removed %d records, only %d had expired", n1+n2, short)
	}
	for i := 0; i < long; i++ {
		mustGet(t, st, fmt.Sprintf("long-%d", i))
	}
	for i := 0; i < short; i++ {
		if _, err := st.Get(ctx, []byte(fmt.Sprintf("short-%d", i))); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("expired record still visible: %v", err)
		}
	}
	if sr, ok := st.(idem.Stater); ok {
		stats, err := sr.Stats(ctx)
		mustOK(t, "Stats after purge", err)
		if stats.Total() != long {
			t.Fatalf("Stats after purge = %+v, want %d live records", stats, long)
		}
	}
}

func listAll(t *testing.T, st idem.Store) ([]idem.Record, int) {
	t.Helper()
	l := st.(idem.Lister)
	var out []idem.Record
	cursor, pages := "", 0
	for {
		recs, next, err := l.ListInProgress(ctxT(t), cursor, 2)
		mustOK(t, "ListInProgress", err)
		if len(recs) > 2 {
			t.Fatalf("ListInProgress returned a page of %d records with limit 2", len(recs))
		}
		out = append(out, recs...)
		pages++
		if next == "" {
			return out, pages
		}
		if pages > 10000 {
			t.Fatalf("ListInProgress does not terminate")
		}
		cursor = next
	}
}

func (s *suite) testList(t *testing.T) {
	st := s.store(t)
	if _, ok := st.(idem.Lister); !ok {
		if s.feat.List {
			t.Fatalf("Features.List is set but %T does not implement idem.Lister", st)
		}
		t.Skip("no idem.Lister")
	}
	ctx := ctxT(t)
	want := map[string]bool{}
	for i := 0; i < 7; i++ {
		k := fmt.Sprintf("busy-%d", i)
		mustClaim(t, st, req(k, longLease, longTTL), idem.OutcomeAcquired)
		want[k] = true
	}
	for i := 0; i < 3; i++ {
		k := fmt.Sprintf("done-%d", i)
		c := mustClaim(t, st, req(k, longLease, longTTL), idem.OutcomeAcquired)
		mustOK(t, "Complete", st.Complete(ctx, []byte(k), c.Record.Token, nil))
	}
	recs, _ := listAll(t, st)
	got := map[string]bool{}
	for _, r := range recs {
		if got[string(r.Key)] {
			t.Fatalf("ListInProgress returned %q twice", r.Key)
		}
		got[string(r.Key)] = true
		if r.State != idem.StateInProgress || r.Token == 0 {
			t.Fatalf("listed record %+v", r)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("ListInProgress returned %v, want %v", got, want)
	}
	for k := range want {
		if !got[k] {
			t.Fatalf("ListInProgress missed %q", k)
		}
	}
}

func (s *suite) testStats(t *testing.T) {
	st := s.store(t)
	sr, ok := st.(idem.Stater)
	if !ok {
		if s.feat.Stats {
			t.Fatalf("Features.Stats is set but %T does not implement idem.Stater", st)
		}
		t.Skip("no idem.Stater")
	}
	ctx := ctxT(t)
	tok := func(k string) uint64 {
		return mustClaim(t, st, req(k, longLease, longTTL), idem.OutcomeAcquired).Record.Token
	}
	tok("p1")
	tok("p2")
	mustOK(t, "Complete", st.Complete(ctx, []byte("c1"), tok("c1"), nil))
	mustOK(t, "Complete", st.Complete(ctx, []byte("c2"), tok("c2"), nil))
	mustOK(t, "Complete", st.Complete(ctx, []byte("c3"), tok("c3"), nil))
	mustOK(t, "Fail", st.Fail(ctx, []byte("f1"), tok("f1"), "x"))
	mustOK(t, "Release", st.Release(ctx, []byte("r1"), tok("r1"), ""))
	got, err := sr.Stats(ctx)
	mustOK(t, "Stats", err)
	want := idem.Stats{InProgress: 2, Completed: 3, Failed: 1, Released: 1}
	if got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
}

func (s *suite) testCompleteBatch(t *testing.T) {
	st := s.store(t)
	bc, ok := st.(idem.BatchCompleter)
	if !ok {
		if s.feat.CompleteBatch {
			t.Fatalf("Features.CompleteBatch is set but %T does not implement idem.BatchCompleter", st)
		}
		t.Skip("store does not implement idem.BatchCompleter (Features.CompleteBatch unset)")
	}
	ctx := ctxT(t)
	u := s.feat.LeaseUnit
	tok := func(k string, lease time.Duration) uint64 {
		return mustClaim(t, st, req(k, lease, longTTL), idem.OutcomeAcquired).Record.Token
	}
	a, b, done := tok("a", longLease), tok("b", longLease), tok("done", longLease)
	mustOK(t, "Complete", st.Complete(ctx, []byte("done"), done, []byte("first")))
	stale := tok("stale", u)
	time.Sleep(2 * u)
	fresh := tok("stale", longLease)
	failed := tok("failed", longLease)
	mustOK(t, "Fail", st.Fail(ctx, []byte("failed"), failed, "x"))
	cs := []idem.Completion{
		{Key: []byte("a"), Token: a, Result: []byte("ra")},
		{Key: []byte("b"), Token: b, Result: nil},
		{Key: []byte("done"), Token: done, Result: []byte("second")},
		{Key: []byte("stale"), Token: stale, Result: []byte("stale")},
		{Key: []byte("never"), Token: 7, Result: nil},
		{Key: nil, Token: 1},
		{Key: []byte("a"), Token: 0},
		{Key: []byte("failed"), Token: failed},
		{Key: []byte("big"), Token: 1, Result: make([]byte, idem.MaxResultLen+1)},
	}
	want := []error{nil, nil, nil, idem.ErrFenced, idem.ErrNotFound, idem.ErrInvalidKey, idem.ErrInvalidArgument, idem.ErrFenced, idem.ErrInvalidArgument}
	errs, err := bc.CompleteBatch(ctx, cs)
	mustOK(t, "CompleteBatch", err)
	if len(errs) != len(cs) {
		t.Fatalf("CompleteBatch returned %d errors for %d entries", len(errs), len(cs))
	}
	for i, w := range want {
		if w == nil {
			mustOK(t, fmt.Sprintf("entry %d (%q)", i, cs[i].Key), errs[i])
		} else {
			mustIs(t, fmt.Sprintf("entry %d (%q)", i, cs[i].Key), errs[i], w)
		}
	}
	if r := mustGet(t, st, "a"); r.State != idem.StateCompleted || string(r.Result) != "ra" {
		t.Fatalf("a = %+v", r)
	}
	if r := mustGet(t, st, "b"); r.State != idem.StateCompleted || len(r.Result) != 0 {
		t.Fatalf("b = %+v", r)
	}
	if r := mustGet(t, st, "done"); string(r.Result) != "first" {
		t.Fatalf("a repeated completion overwrote the result: %q", r.Result)
	}
	if r := mustGet(t, st, "stale"); r.State != idem.StateInProgress || r.Token != fresh {
		t.Fatalf("a stale entry changed the record: %+v", r)
	}
	empty, err := bc.CompleteBatch(ctx, nil)
	mustOK(t, "empty CompleteBatch", err)
	if len(empty) != 0 {
		t.Fatalf("empty batch returned %d errors", len(empty))
	}
}

// testExtendBatch: each entry applied as Extend would (a live claim, one
// past its lease that nobody took over, one past its TTL's end if extended
// in time), its own error for a stale token, a settled record, a missing or
// invalid key, a zero token or lease; a key twice; an empty call. The
// extended leases hold: a claim after the old lease finds them in progress.
func (s *suite) testExtendBatch(t *testing.T) {
	if _, ok := s.store(t).(idem.BatchExtender); !ok {
		if s.feat.ExtendBatch {
			t.Fatalf("Features.ExtendBatch is set but %T does not implement idem.BatchExtender", s.store(t))
		}
		t.Skip("store does not implement idem.BatchExtender (Features.ExtendBatch unset)")
	}
	s.withUnit(t, func(t *testing.T, u time.Duration) error {
		st := s.store(t)
		be := st.(idem.BatchExtender)
		ctx := ctxT(t)
		tok := func(k string, lease, ttl time.Duration) uint64 {
			return mustClaim(t, st, req(k, lease, ttl), idem.OutcomeAcquired).Record.Token
		}
		stale := tok("stale", u, longTTL)
		time.Sleep(2 * u)
		fresh := tok("stale", longLease, longTTL)
		staleRec := mustGet(t, st, "stale")
		done := tok("done", longLease, longTTL)
		mustOK(t, "Complete", st.Complete(ctx, []byte("done"), done, nil))
		claimed := time.Now()
		a := tok("a", 2*u, longTTL)
		short := tok("short-ttl", u, 2*u)
		es := []idem.Extension{
			{Key: []byte("a"), Token: a, Lease: 20 * u},
			{Key: []byte("short-ttl"), Token: short, Lease: 30 * u},
			{Key: []byte("stale"), Token: stale, Lease: 20 * u},
			{Key: []byte("done"), Token: done, Lease: 20 * u},
			{Key: []byte("never"), Token: 7, Lease: 20 * u},
			{Key: nil, Token: 1, Lease: 20 * u},
			{Key: []byte("a"), Token: 0, Lease: 20 * u},
			{Key: []byte("a"), Token: a, Lease: 0},
			{Key: []byte("a"), Token: a, Lease: 20 * u},
		}
		want := []error{nil, nil, idem.ErrFenced, idem.ErrFenced, idem.ErrNotFound, idem.ErrInvalidKey, idem.ErrInvalidArgument, idem.ErrInvalidArgument, nil}
		extended := time.Now()
		errs, err := be.ExtendBatch(ctx, es)
		mustOK(t, "ExtendBatch", err)
		if len(errs) != len(es) {
			t.Fatalf("ExtendBatch returned %d errors for %d entries", len(errs), len(es))
		}
		for i, w := range want {
			what := fmt.Sprintf("entry %d (%q)", i, es[i].Key)
			switch {
			case i == 1 && late(errs[i], claimed, 2*u):
				return lateErr("ExtendBatch of a record with a TTL of %s", 2*u)
			case w == nil:
				mustOK(t, what, errs[i])
			default:
				mustIs(t, what, errs[i], w)
			}
		}
		if r := mustGet(t, st, "stale"); r.State != idem.StateInProgress || r.Token != fresh || !r.LeaseUntil.Equal(staleRec.LeaseUntil) {
			t.Fatalf("a stale entry changed the record: %+v, was %+v", r, staleRec)
		}
		if r := mustGet(t, st, "done"); r.State != idem.StateCompleted {
			t.Fatalf("an entry of a completed record changed it: %+v", r)
		}
		for _, k := range []string{"a", "short-ttl"} {
			r := mustGet(t, st, k)
			if r.ExpiresAt.Before(r.LeaseUntil) {
				t.Fatalf("%s: ExpiresAt %s before LeaseUntil %s", k, r.ExpiresAt, r.LeaseUntil)
			}
		}
		empty, err := be.ExtendBatch(ctx, nil)
		mustOK(t, "empty ExtendBatch", err)
		if len(empty) != 0 {
			t.Fatalf("empty ExtendBatch returned %d errors", len(empty))
		}
		// Past the old leases (2u and u) and the short TTL (2u): both
		// still held.
		time.Sleep(4 * u)
		if err := inProgressUnless(t, st, "a", extended, 20*u); err != nil {
			return err
		}
		return inProgressUnless(t, st, "short-ttl", extended, 30*u)
	})
}
