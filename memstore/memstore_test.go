package memstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

var ctx = context.Background()

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func req(k string) idem.ClaimRequest {
	return idem.ClaimRequest{Key: []byte(k), Lease: time.Minute, TTL: time.Hour}
}

func TestCapacityFailsClosed(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1e9, 0)}
	s, err := memstore.New(memstore.Config{MaxEntries: 4, Shards: 1, Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 4; i++ {
		if _, err := s.Claim(ctx, req(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Claim(ctx, req("over")); !errors.Is(err, idem.ErrCapacity) {
		t.Fatalf("claim beyond MaxEntries: %v, want ErrCapacity", err)
	}
	// Existing keys still answer.
	if c, err := s.Claim(ctx, req("0")); err != nil || c.Outcome != idem.OutcomeInProgress {
		t.Fatalf("existing key at capacity: %v %v", c.Outcome, err)
	}
	clk.Add(2 * time.Hour) // everything expires: room again without a sweep
	if c, err := s.Claim(ctx, req("over")); err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("after expiry: %v %v", c.Outcome, err)
	}
}

// A purge skips a shard whose entries all expire later than the earliest
// expiry it knows of; a takeover with a shorter TTL brings that earlier,
// so the full shard finds room once the retaken key expires.
func TestCapacityAfterShorterTakeover(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1e9, 0)}
	s, err := memstore.New(memstore.Config{MaxEntries: 2, Shards: 1, Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Claim(ctx, req("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, []byte("a"), c.Record.Token, ""); err != nil {
		t.Fatal(err)
	}
	short := idem.ClaimRequest{Key: []byte("a"), Lease: time.Second, TTL: time.Second}
	if c, err := s.Claim(ctx, short); err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("takeover: %v %v", c.Outcome, err)
	}
	if _, err := s.Claim(ctx, req("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, req("c")); !errors.Is(err, idem.ErrCapacity) {
		t.Fatalf("claim beyond MaxEntries: %v, want ErrCapacity", err)
	}
	clk.Add(2 * time.Second) // "a" expired, "b" not
	if c, err := s.Claim(ctx, req("c")); err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("after a's expiry: %v %v", c.Outcome, err)
	}
	if n, err := s.Purge(ctx, 0); n != 0 || err != nil {
		t.Fatalf("Purge = %d, %v; want nothing left to drop", n, err)
	}
	clk.Add(2 * time.Hour)
	if n, err := s.Purge(ctx, 0); n != 2 || err != nil {
		t.Fatalf("Purge = %d, %v; want b and c dropped", n, err)
	}
}

func TestSweeperDropsExpired(t *testing.T) {
	s, err := memstore.New(memstore.Config{SweepInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 100; i++ {
		s.Claim(ctx, idem.ClaimRequest{Key: []byte(fmt.Sprint(i)), Lease: time.Millisecond, TTL: time.Millisecond})
	}
	s.Claim(ctx, req("keep"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, _ := s.Stats(ctx)
		n, _ := s.Purge(ctx, 0)
		if st.Total() == 1 && n == 0 {
			break // the sweeper, not Purge, removed them
		}
		if time.Now().After(deadline) {
			t.Fatalf("sweeper left %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestClosed(t *testing.T) {
	s, _ := memstore.New(memstore.Config{})
	ns, _ := s.Namespace("other")
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Claim(ctx, req("k")); err != nil {
		t.Fatalf("closing a namespace handle closed the backend: %v", err)
	}
	s.Close()
	s.Close()
	if _, err := s.Claim(ctx, req("k")); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if _, err := ns.Get(ctx, []byte("k")); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("namespace after Close: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []memstore.Config{{MaxEntries: -1}, {Shards: -2}, {Namespace: "bad ns"}} {
		if _, err := memstore.New(c); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v", c, err)
		}
	}
}

func TestReturnedBytesAreCopies(t *testing.T) {
	s, _ := memstore.New(memstore.Config{})
	defer s.Close()
	res := []byte("result")
	fp := []byte("fp")
	c, _ := s.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
	c.Record.Fingerprint[1] = 'Q' // the claim's record may share the request's bytes, never the store's
	fp[0] = 'W'
	s.Complete(ctx, []byte("k"), c.Record.Token, res)
	res[0] = 'X'
	r, _ := s.Get(ctx, []byte("k"))
	r.Result[1] = 'Y'
	r.Fingerprint[0] = 'Z'
	r2, _ := s.Get(ctx, []byte("k"))
	if string(r2.Result) != "result" || string(r2.Fingerprint) != "fp" {
		t.Fatalf("store shares memory with callers: %q %q", r2.Result, r2.Fingerprint)
	}
}

// FuzzKeyRoundTrip: any valid key is stored and found under exactly its own
// bytes, and a key differing in one byte is a different record.
func FuzzKeyRoundTrip(f *testing.F) {
	f.Add([]byte("a"), byte(0))
	f.Add([]byte("a\x00b"), byte(1))
	f.Add([]byte("\xff\xfe"), byte(0xff))
	f.Add([]byte("Case "), byte(' '))
	s, _ := memstore.New(memstore.Config{SweepInterval: -1})
	f.Cleanup(func() { s.Close() })
	f.Fuzz(func(t *testing.T, key []byte, flip byte) {
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Lease: time.Minute, TTL: time.Hour})
		if idem.ValidateKey(key) != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("invalid key accepted: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		defer s.Delete(ctx, key)
		if c.Outcome == idem.OutcomeAcquired {
			if err := s.Complete(ctx, key, c.Record.Token, key); err != nil {
				t.Fatal(err)
			}
		}
		r, err := s.Get(ctx, key)
		if err != nil || !bytes.Equal(r.Key, key) {
			t.Fatalf("Get: %v, key %q", err, r.Key)
		}
		other := append([]byte(nil), key...)
		other[int(flip)%len(other)] ^= 1 + flip%255
		if _, err := s.Get(ctx, other); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("a key differing in one byte found a record: %v", err)
		}
	})
}

func TestClassifyError(t *testing.T) {
	s, err := memstore.New(memstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, e := range []error{nil, idem.ErrCapacity, idem.ErrClosed, idem.ErrFenced, fmt.Errorf("%w: x", idem.ErrUnavailable)} {
		if got := s.ClassifyError(e); got != e {
			t.Fatalf("ClassifyError(%v) = %v, want it unchanged", e, got)
		}
	}
}

// Fingerprints up to 32 bytes live inline in the record, longer ones
// apart: either way a claim with the same fingerprint finds it, one
// differing in any byte (or in length) is a mismatch, Get returns it, and
// a record claimed without one takes the first one given on a takeover.
func TestFingerprintLengths(t *testing.T) {
	s, _ := memstore.New(memstore.Config{})
	defer s.Close()
	for _, n := range []int{1, 31, 32, 33, idem.MaxFingerprintLen} {
		fp := bytes.Repeat([]byte{'f'}, n)
		fp[n-1] = byte(n)
		key := []byte(fmt.Sprint("fp-", n))
		r := idem.ClaimRequest{Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
		c, err := s.Claim(ctx, r)
		if err != nil || c.Outcome != idem.OutcomeAcquired {
			t.Fatalf("%d bytes: claim: %v %v", n, c.Outcome, err)
		}
		if c, err := s.Claim(ctx, r); err != nil || c.Outcome != idem.OutcomeInProgress || !bytes.Equal(c.Record.Fingerprint, fp) {
			t.Fatalf("%d bytes: same fingerprint: %v %q %v", n, c.Outcome, c.Record.Fingerprint, err)
		}
		for _, other := range [][]byte{append(bytes.Clone(fp[:n-1]), 'x'), fp[:n-1], append(bytes.Clone(fp), 'x')} {
			if len(other) == 0 || len(other) > idem.MaxFingerprintLen {
				continue
			}
			r2 := r
			r2.Fingerprint = other
			if _, err := s.Claim(ctx, r2); !errors.Is(err, idem.ErrFingerprintMismatch) {
				t.Fatalf("%d bytes: fingerprint %q: %v, want a mismatch", n, other, err)
			}
		}
		if g, err := s.Get(ctx, key); err != nil || !bytes.Equal(g.Fingerprint, fp) {
			t.Fatalf("%d bytes: Get: %q %v", n, g.Fingerprint, err)
		}
		// Claimed without a fingerprint, released, taken over with one.
		bare := []byte(fmt.Sprint("bare-", n))
		c, _ = s.Claim(ctx, idem.ClaimRequest{Key: bare, Lease: time.Minute, TTL: time.Hour})
		if err := s.Release(ctx, bare, c.Record.Token, ""); err != nil {
			t.Fatal(err)
		}
		r.Key = bare
		if c, err := s.Claim(ctx, r); err != nil || c.Outcome != idem.OutcomeAcquired || !bytes.Equal(c.Record.Fingerprint, fp) {
			t.Fatalf("%d bytes: takeover: %v %q %v", n, c.Outcome, c.Record.Fingerprint, err)
		}
	}
}

// ClaimBatchInto answers as ClaimBatch, into the caller's slice, which
// must have one entry per claim.
func TestClaimBatchInto(t *testing.T) {
	s, _ := memstore.New(memstore.Config{})
	defer s.Close()
	reqs := []idem.ClaimRequest{req("a"), req("b"), req("a"), {Key: nil, Lease: time.Minute, TTL: time.Hour}}
	out := make([]idem.BatchResult, len(reqs))
	for i := range out {
		out[i].Claim.Outcome = idem.OutcomeFailed // stale: every entry is written
	}
	if err := s.ClaimBatchInto(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Claim.Outcome != idem.OutcomeAcquired || out[1].Claim.Outcome != idem.OutcomeAcquired ||
		out[2].Claim.Outcome != idem.OutcomeInProgress || !errors.Is(out[3].Err, idem.ErrInvalidKey) || out[3].Claim.Outcome != 0 {
		t.Fatalf("results: %+v", out)
	}
	if err := s.ClaimBatchInto(ctx, reqs, out[:3]); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("3 results for 4 claims: %v, want ErrInvalidArgument", err)
	}
}
