package faultstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
)

// A fault limited to keys fails the calls on those keys, single or as
// entries of a batch, and lets every other call through.
func TestFaultLimitedToKeys(t *testing.T) {
	ctx := context.Background()
	mem, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	fs := faultstore.New(mem)
	st := fs.WithBatch()
	only := func(k []byte) bool { return string(k) == "b" }
	for _, op := range []faultstore.Op{faultstore.OpBatch, faultstore.OpComplete, faultstore.OpCompleteBatch, faultstore.OpExtendBatch} {
		fs.Inject(op, faultstore.Fault{Keys: only})
	}
	req := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Lease: time.Minute, TTL: time.Hour}
	}
	rs, err := st.(idem.BatchClaimer).ClaimBatch(ctx, []idem.ClaimRequest{req("a"), req("b"), req("c")})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if refused := errors.Is(r.Err, idem.ErrUnavailable); refused != (i == 1) || !refused && r.Claim.Outcome != idem.OutcomeAcquired {
			t.Fatalf("batch claim entry %d: %+v", i, r)
		}
	}
	b, err := st.Claim(ctx, req("b")) // OpClaim has no fault
	if err != nil || b.Outcome != idem.OutcomeAcquired {
		t.Fatalf("claim b: %+v, %v", b, err)
	}
	xerrs, err := st.(idem.BatchExtender).ExtendBatch(ctx, []idem.Extension{
		{Key: []byte("a"), Token: rs[0].Claim.Record.Token, Lease: time.Minute}, {Key: []byte("b"), Token: b.Record.Token, Lease: time.Minute}})
	if err != nil || xerrs[0] != nil || !errors.Is(xerrs[1], idem.ErrUnavailable) {
		t.Fatalf("extend batch: %v, %v; want a extended, b unavailable", xerrs, err)
	}
	if err := st.Complete(ctx, []byte("b"), b.Record.Token, nil); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("complete b: %v, want unavailable", err)
	}
	if err := st.Complete(ctx, []byte("a"), rs[0].Claim.Record.Token, nil); err != nil {
		t.Fatalf("complete a: %v", err)
	}
	errs, err := st.(idem.BatchCompleter).CompleteBatch(ctx, []idem.Completion{
		{Key: []byte("b"), Token: b.Record.Token}, {Key: []byte("c"), Token: rs[2].Claim.Record.Token}})
	if err != nil || !errors.Is(errs[0], idem.ErrUnavailable) || errs[1] != nil {
		t.Fatalf("complete batch: %v, %v; want b unavailable, c completed", errs, err)
	}
	for k, want := range map[string]idem.State{"a": idem.StateCompleted, "b": idem.StateInProgress, "c": idem.StateCompleted} {
		if r, err := mem.Get(ctx, []byte(k)); err != nil || r.State != want {
			t.Fatalf("%s: %+v, %v; want state %v", k, r, err, want)
		}
	}
	fs.Clear()
	if err := st.Complete(ctx, []byte("b"), b.Record.Token, nil); err != nil {
		t.Fatalf("complete b after Clear: %v", err)
	}
}
