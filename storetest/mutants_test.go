package storetest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/storetest"
)

// mutant wraps the memory store with one deliberate contract violation.
type mutant struct {
	idem.Store
	kind string
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
	return m.Store.Claim(ctx, r)
}

func (m mutant) Complete(ctx context.Context, k []byte, tok uint64, res []byte) error {
	k = m.key(k)
	if m.kind == "ignore-fencing" {
		if r, err := m.Store.Get(ctx, k); err == nil && r.State == idem.StateInProgress {
			tok = r.Token
		}
	}
	return m.Store.Complete(ctx, k, tok, res)
}

func (m mutant) Get(ctx context.Context, k []byte) (idem.Record, error) {
	r, err := m.Store.Get(ctx, m.key(k))
	if err == nil {
		r.Key = k
	}
	return r, err
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
	storetest.Run(t, func(t testing.TB, ns string) idem.Store {
		s, _ := root.Namespace(ns)
		return mutant{Store: s, kind: kind}
	}, storetest.Features{LeaseUnit: 20 * 1e6})
}

// TestSuiteCatchesMutants proves the suite can fail: each deliberately
// broken store must make it fail.
func TestSuiteCatchesMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("child")
	}
	for _, kind := range []string{"check-then-set", "ignore-fencing", "fold-case", "trim-space", "no-fingerprint"} {
		t.Run(kind, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutantChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+kind)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store that violates the contract (%s):\n%s", kind, out)
			}
			if !bytes.Contains(out, []byte("--- FAIL")) {
				t.Fatalf("child failed without a test failure:\n%s", out)
			}
		})
	}
}
