package storetest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/storetest"
)

// mutant wraps the memory store with one deliberate contract violation. It
// also plays a store that can hold undecodable records (damaged marks keys
// whose record "fails to decode"), so that the bad-record rules can be
// checked, and it tracks each key's last TTL for the maintenance mutants.
type mutant struct {
	idem.Store
	kind string
	*mutState
}

// slowSeen: key names the slow-short-claims mutant has already delayed.
var slowSeen sync.Map

func (mutant) firstShort(k []byte) bool {
	_, seen := slowSeen.LoadOrStore(string(k), true)
	return !seen
}

// mutState is shared by the mutants of one namespace.
type mutState struct {
	mu      sync.Mutex
	damaged map[string]bool
	ttl     map[string]time.Duration
}

func newMutState() *mutState {
	return &mutState{damaged: map[string]bool{}, ttl: map[string]time.Duration{}}
}

func (m mutant) bad(k []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.damaged[string(k)] {
		return fmt.Errorf("%w: key %q: checksum mismatch", idem.ErrCorrupt, k)
	}
	return nil
}

func (m mutant) claimed(r idem.ClaimRequest, c idem.Claim, err error) {
	if err == nil && c.Outcome == idem.OutcomeAcquired {
		m.mu.Lock()
		m.ttl[string(r.Key)] = r.TTL
		m.mu.Unlock()
	}
}

func (m mutant) key(k []byte) []byte {
	switch m.kind {
	case "fold-case":
		return bytes.ToLower(k)
	case "trim-space":
		if t := bytes.TrimRight(k, " "); len(t) > 0 {
			return t
		}
	}
	return k
}

func (m mutant) Claim(ctx context.Context, r idem.ClaimRequest) (idem.Claim, error) {
	r.Key = m.key(r.Key)
	if err := idem.ValidateClaim(r); err != nil {
		return idem.Claim{}, err
	}
	if err := m.bad(r.Key); err != nil {
		return idem.Claim{}, err
	}
	if m.kind == "no-fingerprint" {
		r.Fingerprint = nil
	}
	if m.kind == "check-then-set" {
		// Reads, then claims: two callers that both read "absent" both
		// believe they own the key.
		_, gerr := m.Store.Get(ctx, r.Key)
		time.Sleep(5 * time.Millisecond) // the window between the check and the set, wide enough to hit under load
		c, err := m.Store.Claim(ctx, r)
		if errors.Is(gerr, idem.ErrNotFound) && err == nil && c.Outcome == idem.OutcomeInProgress {
			c.Outcome = idem.OutcomeAcquired
		}
		return c, err
	}
	c, err := m.Store.Claim(ctx, r)
	m.claimed(r, c, err)
	if m.kind == "slow-short-claims" && r.TTL < time.Second && m.firstShort(r.Key) {
		// A correct store whose reply comes late: the claim is applied,
		// then the caller hears of it only after the record's TTL has
		// run out (mysqlstore's claim waiting on maintenance's LOCK
		// TABLES, with the statement's clock taken before the wait, on a
		// loaded machine). The record expired by its own ExpiresAt: the
		// suite must neither call that a removal nor fail the store. Once
		// per key name, so a case that starts again with a longer unit
		// finds the machine fast again.
		time.Sleep(max(r.TTL, r.Lease) + 10*time.Millisecond)
	}
	return c, err
}

// ClaimBatch answers damaged entries itself and passes the others on in one
// batch, so that they keep batch semantics (a key twice, one instant).
func (m mutant) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	out := make([]idem.BatchResult, len(reqs))
	var pass []idem.ClaimRequest
	var at []int
	for i, r := range reqs {
		r.Key = m.key(r.Key)
		if err := m.bad(r.Key); err != nil {
			if m.kind == "batch-fails-on-bad-record" {
				return nil, err
			}
			out[i].Err = err
			continue
		}
		pass = append(pass, r)
		at = append(at, i)
	}
	res, err := m.Store.(idem.BatchClaimer).ClaimBatch(ctx, pass)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		out[i] = res[j]
		m.claimed(pass[j], res[j].Claim, res[j].Err)
	}
	return out, nil
}

func (m mutant) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	errs := make([]error, len(cs))
	for i, c := range cs {
		errs[i] = m.Complete(ctx, c.Key, c.Token, c.Result)
	}
	return errs, nil
}

func (m mutant) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	errs := make([]error, len(es))
	for i, x := range es {
		if m.kind == "extend-batch-no-op" && idem.ValidateToken(x.Key, x.Token) == nil && idem.ValidateLease(x.Lease) == nil {
			continue // answers nil without extending
		}
		errs[i] = m.Extend(ctx, x.Key, x.Token, x.Lease)
	}
	return errs, nil
}

func (m mutant) Complete(ctx context.Context, k []byte, tok uint64, res []byte) error {
	k = m.key(k)
	if err := m.bad(k); err != nil {
		return err
	}
	if m.kind == "ignore-fencing" {
		if r, err := m.Store.Get(ctx, k); err == nil && r.State == idem.StateInProgress {
			tok = r.Token
		}
	}
	return m.Store.Complete(ctx, k, tok, res)
}

func (m mutant) Release(ctx context.Context, k []byte, tok uint64, cause string) error {
	if err := m.bad(k); err != nil {
		return err
	}
	return m.Store.Release(ctx, k, tok, cause)
}

func (m mutant) Fail(ctx context.Context, k []byte, tok uint64, cause string) error {
	if err := m.bad(k); err != nil {
		return err
	}
	return m.Store.Fail(ctx, k, tok, cause)
}

func (m mutant) Extend(ctx context.Context, k []byte, tok uint64, lease time.Duration) error {
	if err := m.bad(k); err != nil {
		return err
	}
	return m.Store.Extend(ctx, k, tok, lease)
}

func (m mutant) Get(ctx context.Context, k []byte) (idem.Record, error) {
	if err := idem.ValidateKey(k); err != nil {
		return idem.Record{}, err
	}
	if err := m.bad(m.key(k)); err != nil {
		return idem.Record{}, err
	}
	r, err := m.Store.Get(ctx, m.key(k))
	if err == nil {
		r.Key = k
	}
	return r, err
}

// Purge is the memory store's, after the maintenance mutants' own removals
// (not counted).
func (m mutant) Purge(ctx context.Context, limit int) (int, error) {
	m.mu.Lock()
	var keys [][]byte
	for k, ttl := range m.ttl {
		if ttl < time.Second {
			keys = append(keys, []byte(k))
		}
	}
	m.mu.Unlock()
	if limit > 0 {
		keys = nil // the mutants break maintenance rounds, Purge(ctx, 0)
	}
	switch m.kind {
	case "purge-check-then-drop":
		// Checks which short-lived records expired, then removes them a
		// little later without checking again (what a DROP PARTITION after
		// an unlocked "no live row" query does): a record created again in
		// between is lost.
		var due [][]byte
		for _, k := range keys {
			if _, err := m.Store.Get(ctx, k); errors.Is(err, idem.ErrNotFound) {
				due = append(due, k)
			}
		}
		time.Sleep(5 * time.Millisecond)
		for _, k := range due {
			if err := m.Store.Delete(ctx, k); err != nil {
				return 0, err
			}
		}
	case "purge-early":
		// Removes short-lived records that are about to expire (a skewed
		// clock, or <= where < was meant, made large).
		for _, k := range keys {
			if r, err := m.Store.Get(ctx, k); err == nil && time.Until(r.ExpiresAt) < 100*time.Millisecond {
				if err := m.Store.Delete(ctx, k); err != nil {
					return 0, err
				}
			}
		}
	}
	return m.Store.(idem.Purger).Purge(ctx, limit)
}

const mutantEnv = "STORETEST_MUTANT"

// TestMutantChild runs the suite against one mutant; only in a child
// process started by TestSuiteCatchesMutants.
func TestMutantChild(t *testing.T) {
	kind := os.Getenv(mutantEnv)
	if kind == "" {
		t.Skip("runs only as a child of TestSuiteCatchesMutants")
	}
	root, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	var mu sync.Mutex
	states := map[string]*mutState{}
	storetest.Run(t, func(t testing.TB, ns string) idem.Store {
		s, _ := root.Namespace(ns)
		mu.Lock()
		defer mu.Unlock()
		if states[ns] == nil {
			states[ns] = newMutState()
		}
		return mutant{Store: s, kind: kind, mutState: states[ns]}
	}, storetest.Features{
		Batch: true, CompleteBatch: true, ExtendBatch: true, Purge: true, LeaseUnit: 20 * time.Millisecond,
		CorruptRecord: func(t testing.TB, st idem.Store, key []byte) {
			m := st.(mutant)
			m.mu.Lock()
			m.damaged[string(key)] = true
			m.mu.Unlock()
		},
	})
}

// TestSuiteCatchesMutants proves the suite can fail: each deliberately
// broken store must make it fail, in the case named when one is (a mutant
// of a newer rule must be caught by the case written for that rule). The
// control, the same wrapper with no violation, must pass.
func TestSuiteCatchesMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("child")
	}
	for _, tc := range []struct{ kind, caughtBy string }{
		{"control", ""},
		// A correct store, slow: must pass like the control.
		{"slow-short-claims", ""},
		{"check-then-set", ""}, {"ignore-fencing", ""}, {"fold-case", ""}, {"trim-space", ""}, {"no-fingerprint", ""},
		{"batch-fails-on-bad-record", "BadRecordPerKey"},
		{"extend-batch-no-op", "ExtendBatch"},
		{"purge-check-then-drop", "MaintenanceKeepsLiveRecords"},
		{"purge-early", "MaintenanceKeepsLiveRecords"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutantChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+tc.kind)
			out, err := cmd.CombinedOutput()
			if tc.kind == "control" || tc.kind == "slow-short-claims" {
				if err != nil {
					t.Fatalf("the suite failed the mutants' wrapper without a violation:\n%s", out)
				}
				return
			}
			if err == nil {
				t.Fatalf("the suite passed a store that violates the contract (%s):\n%s", tc.kind, out)
			}
			if !bytes.Contains(out, []byte("--- FAIL")) {
				t.Fatalf("child failed without a test failure:\n%s", out)
			}
			if tc.caughtBy != "" && !bytes.Contains(out, []byte("--- FAIL: TestMutantChild/"+tc.caughtBy+" ")) {
				t.Fatalf("%s was not caught by %s:\n%s", tc.kind, tc.caughtBy, out)
			}
		})
	}
}
