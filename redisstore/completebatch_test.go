package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
)

// TestCompleteBatchChunks completes a batch split over several scripts
// (BatchChunk 3, and results large enough to split on bytes) with repeated
// keys and stale tokens mixed in, and checks every entry against what
// Complete would have done.
func TestCompleteBatchChunks(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
	s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix, BatchChunk: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reqs []idem.ClaimRequest
	for i := range 20 {
		reqs = append(reqs, claimReq("k"+strconv.Itoa(i)))
	}
	res, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("x"), 700<<10) // two of these exceed one script's byte budget
	var cs []idem.Completion
	var want []error
	for i, r := range res {
		result := []byte("r" + strconv.Itoa(i))
		if i%5 == 0 {
			result = big
		}
		tok := r.Claim.Record.Token
		cs = append(cs, idem.Completion{Key: reqs[i].Key, Token: tok, Result: result})
		want = append(want, nil)
		if i%4 == 0 { // the same completion again: a no-op success
			cs = append(cs, idem.Completion{Key: reqs[i].Key, Token: tok, Result: []byte("other")})
			want = append(want, nil)
		}
		if i%7 == 0 {
			cs = append(cs, idem.Completion{Key: reqs[i].Key, Token: tok + 1})
			want = append(want, idem.ErrFenced)
		}
	}
	cs = append(cs, idem.Completion{Key: []byte("absent"), Token: 5}, idem.Completion{Key: []byte("k1")})
	want = append(want, idem.ErrNotFound, idem.ErrInvalidArgument)
	errs, err := s.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != len(cs) {
		t.Fatalf("%d errors for %d entries", len(errs), len(cs))
	}
	for i, w := range want {
		if (w == nil) != (errs[i] == nil) || w != nil && !errors.Is(errs[i], w) {
			t.Fatalf("entry %d (%q token %d): %v, want %v", i, cs[i].Key, cs[i].Token, errs[i], w)
		}
	}
	for i, r := range reqs {
		rec, err := s.Get(ctx, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		wantRes := []byte("r" + strconv.Itoa(i))
		if i%5 == 0 {
			wantRes = big
		}
		if rec.State != idem.StateCompleted || !bytes.Equal(rec.Result, wantRes) {
			t.Fatalf("%s: state %v, result of %d bytes", r.Key, rec.State, len(rec.Result))
		}
	}
}

// TestCompleteBatchCorruptRecord: a corrupt record fails its own entry
// only; the others are completed.
func TestCompleteBatchCorruptRecord(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
	s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix, Namespace: "orders"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.ClaimBatch(ctx, []idem.ClaimRequest{claimReq("a"), claimReq("order-42"), claimReq("b")})
	if err != nil {
		t.Fatal(err)
	}
	// Key layout pinned by TestKeyLayout.
	if err := c.Set(ctx, prefix+"orders:{756}:k:order-42", "garbage", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	cs := make([]idem.Completion, len(res))
	for i, r := range res {
		cs[i] = idem.Completion{Key: r.Claim.Record.Key, Token: r.Claim.Record.Token}
	}
	errs, err := s.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[2] != nil || errs[1] == nil {
		t.Fatalf("errs = %v, want only the corrupt entry to fail", errs)
	}
	if err := s.Complete(ctx, cs[1].Key, cs[1].Token, nil); err == nil {
		t.Fatal("Complete of a corrupt record succeeded")
	}
}

// TestCompleteBatchClosedAndCancelled: a closed store or a done context
// fails the call before any I/O.
func TestCompleteBatchClosedAndCancelled(t *testing.T) {
	c := ownClient(t, "127.0.0.1:1") // nothing listens: any I/O would fail differently
	s := mustNew(t, redisstore.Config{Client: c, SkipChecks: true})
	cs := []idem.Completion{{Key: []byte("k"), Token: 1}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.CompleteBatch(ctx, cs); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	errs, err := s.CompleteBatch(context.Background(), []idem.Completion{{Key: nil, Token: 1}, {Key: []byte("k")}})
	if err != nil || !errors.Is(errs[0], idem.ErrInvalidKey) || !errors.Is(errs[1], idem.ErrInvalidArgument) {
		t.Fatalf("invalid entries: %v %v", errs, err)
	}
	s.Close()
	if _, err := s.CompleteBatch(context.Background(), cs); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
