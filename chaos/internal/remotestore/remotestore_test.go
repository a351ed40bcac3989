package remotestore

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t testing.TB, st idem.Store) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = Serve(ln, st) })
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// TestConformance: the embedded store behind the harness's store server
// keeps the whole store contract (storetest), so the harness's bolt runs
// test boltstore and not a looser copy of it.
func TestConformance(t *testing.T) {
	root, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "idem.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	storetest.Run(t, func(t testing.TB, ns string) idem.Store {
		s, err := root.Namespace(ns)
		if err != nil {
			t.Fatal(err)
		}
		c := Dial(serve(t, s), 10*time.Second)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c
	}, storetest.Features{Batch: true, CompleteBatch: true, ExtendBatch: true, LeaseUnit: 200 * time.Millisecond})
}

// TestConformanceMemstore: the client over the memory store, batch calls
// forwarded to its own batch methods.
func TestConformanceMemstore(t *testing.T) {
	memConformance(t, func(s idem.Store) idem.Store { return s })
}

// singleOnly hides a store's optional capabilities.
type singleOnly struct{ idem.Store }

// TestConformanceSingleOnly: a served store without the batch
// capabilities gets the batch calls entry by entry, and the client still
// keeps their contract.
func TestConformanceSingleOnly(t *testing.T) {
	memConformance(t, func(s idem.Store) idem.Store { return singleOnly{s} })
}

// memConformance runs storetest on clients of the memory store's
// namespaces, each served as wrap makes it.
func memConformance(t *testing.T, wrap func(idem.Store) idem.Store) {
	root := newMem(t)
	t.Cleanup(func() { root.Close() })
	storetest.Run(t, func(t testing.TB, ns string) idem.Store {
		s, err := root.Namespace(ns)
		if err != nil {
			t.Fatal(err)
		}
		c := Dial(serve(t, wrap(s)), 10*time.Second)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c
	}, storetest.Features{Batch: true, CompleteBatch: true, ExtendBatch: true, LeaseUnit: 100 * time.Millisecond})
}

// TestBatchOnTheWire: each batch call is one call to the served store's
// batch method, per-entry errors come back as idem's sentinels, and a
// server that dies holding a batch call fails the whole call with
// ErrUnknownOutcome (no results).
func TestBatchOnTheWire(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Store: newMem(t)}
	defer st.Close()
	c := Dial(serve(t, st), 5*time.Second)
	defer c.Close()
	reqs := []idem.ClaimRequest{
		{Key: []byte("a"), Fingerprint: []byte("1"), Lease: time.Minute, TTL: time.Hour},
		{Key: []byte("b"), Lease: time.Minute, TTL: time.Hour},
		{Key: nil, Lease: time.Minute, TTL: time.Hour},
		{Key: []byte("a"), Fingerprint: []byte("2"), Lease: time.Minute, TTL: time.Hour},
	}
	res, err := c.ClaimBatch(ctx, reqs)
	if err != nil || len(res) != 4 {
		t.Fatalf("ClaimBatch: %v %v", res, err)
	}
	if res[0].Claim.Outcome != idem.OutcomeAcquired || res[1].Claim.Outcome != idem.OutcomeAcquired ||
		!errors.Is(res[2].Err, idem.ErrInvalidKey) || !errors.Is(res[3].Err, idem.ErrFingerprintMismatch) {
		t.Fatalf("ClaimBatch results: %+v", res)
	}
	errs, err := c.ExtendBatch(ctx, []idem.Extension{{Key: []byte("a"), Token: res[0].Claim.Record.Token, Lease: time.Minute},
		{Key: []byte("b"), Token: res[1].Claim.Record.Token + 1, Lease: time.Minute}})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], idem.ErrFenced) {
		t.Fatalf("ExtendBatch: %v %v", errs, err)
	}
	errs, err = c.CompleteBatch(ctx, []idem.Completion{{Key: []byte("a"), Token: res[0].Claim.Record.Token, Result: []byte("r")},
		{Key: []byte("nope"), Token: 1}})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], idem.ErrNotFound) {
		t.Fatalf("CompleteBatch: %v %v", errs, err)
	}
	if got := st.batchCalls.Load(); got != 3 {
		t.Fatalf("%d batch calls reached the store, want 3 (one per client call)", got)
	}
	if got := st.singleCalls.Load(); got != 0 {
		t.Fatalf("%d single-record calls reached the store, want 0", got)
	}

	// A server that reads each call and hangs up.
	dead := Dial(hangUp(t, 3), 5*time.Second)
	if res, err := dead.ClaimBatch(ctx, reqs[:2]); !errors.Is(err, idem.ErrUnknownOutcome) || res != nil {
		t.Fatalf("ClaimBatch, hung up mid-call: %v %v, want ErrUnknownOutcome and no results", res, err)
	}
	if errs, err := dead.CompleteBatch(ctx, []idem.Completion{{Key: []byte("a"), Token: 1}}); !errors.Is(err, idem.ErrUnknownOutcome) || errs != nil {
		t.Fatalf("CompleteBatch, hung up mid-call: %v %v", errs, err)
	}
	if errs, err := dead.ExtendBatch(ctx, []idem.Extension{{Key: []byte("a"), Token: 1, Lease: time.Second}}); !errors.Is(err, idem.ErrUnknownOutcome) || errs != nil {
		t.Fatalf("ExtendBatch, hung up mid-call: %v %v", errs, err)
	}
	dead.Close()
}

// hangUp listens on a port whose first n connections are closed after
// reading a call's first bytes; it returns the address.
func hangUp(t *testing.T, n int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for range n {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			_, _ = conn.Read(buf)
			conn.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// countingStore counts the calls that reach the served store.
type countingStore struct {
	*memstore.Store
	batchCalls, singleCalls atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	s.singleCalls.Add(1)
	return s.Store.Claim(ctx, req)
}

func (s *countingStore) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	s.singleCalls.Add(1)
	return s.Store.Complete(ctx, key, token, result)
}

func (s *countingStore) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	s.singleCalls.Add(1)
	return s.Store.Extend(ctx, key, token, lease)
}

func (s *countingStore) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	s.batchCalls.Add(1)
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *countingStore) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	s.batchCalls.Add(1)
	return s.Store.CompleteBatch(ctx, cs)
}

func (s *countingStore) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	s.batchCalls.Add(1)
	return s.Store.ExtendBatch(ctx, es)
}

// TestErrorsOnTheWire: nothing listening is ErrUnavailable (the call was
// never sent); a server that dies holding the call, or answers after the
// deadline, is ErrUnknownOutcome; store errors come back as idem's
// sentinels.
func TestErrorsOnTheWire(t *testing.T) {
	ctx := context.Background()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c := Dial(addr, time.Second)
	if _, err := c.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), Lease: time.Second, TTL: time.Minute}); !errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("refused: %v, want ErrUnavailable only", err)
	}
	c.Close()

	// A server that reads the call and hangs up.
	c = Dial(hangUp(t, 1), 5*time.Second)
	err := c.Complete(ctx, []byte("k"), 1, nil)
	if !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("hung up mid-call: %v, want ErrUnknownOutcome", err)
	}
	c.Close()

	// A server that never answers: the deadline makes it unknown.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	held := make(chan net.Conn, 1)
	wg.Go(func() {
		conn, err := ln.Accept()
		if err == nil {
			held <- conn
		}
	})
	c = Dial(ln.Addr().String(), 200*time.Millisecond)
	if err := c.Extend(ctx, []byte("k"), 1, time.Second); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("no answer: %v, want ErrUnknownOutcome", err)
	}
	c.Close()
	ln.Close()
	wg.Wait()
	(<-held).Close()

	// Sentinels round-trip.
	st, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "s.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c = Dial(serve(t, st), time.Second)
	defer c.Close()
	cl, err := c.Claim(ctx, idem.ClaimRequest{Key: []byte("s"), Fingerprint: []byte("a"), Lease: time.Minute, TTL: time.Hour})
	if err != nil || cl.Outcome != idem.OutcomeAcquired {
		t.Fatalf("claim: %+v %v", cl, err)
	}
	if _, err := c.Claim(ctx, idem.ClaimRequest{Key: []byte("s"), Fingerprint: []byte("b"), Lease: time.Minute, TTL: time.Hour}); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	if err := c.Complete(ctx, []byte("s"), cl.Record.Token+1, nil); !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("fenced: %v", err)
	}
	if _, err := c.Get(ctx, []byte("absent")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("not found: %v", err)
	}
	if err := c.ClassifyError(errors.New("x")); errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("classify: %v", err)
	}
}

func newMem(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
