package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

// An operator releases a key whose worker died holding a long lease: the
// dead holder is fenced and the next claim takes the key with a larger
// token.
func ExampleStore_ForceRelease() {
	cfg, _ := memstore.FromURL("memory://?namespace=orders")
	s, _ := memstore.New(cfg)
	defer s.Close()
	ctx := context.Background()
	req := idem.ClaimRequest{Key: []byte("order-1"), Lease: time.Hour, TTL: 24 * time.Hour}
	stuck, _ := s.Claim(ctx, req)

	var fr idem.ForceReleaser = s // the optional capability
	fmt.Println(fr.ForceRelease(ctx, []byte("order-1"), "worker host-7 died"))
	fmt.Println(errors.Is(s.Complete(ctx, []byte("order-1"), stuck.Record.Token, nil), idem.ErrFenced))
	next, _ := s.Claim(ctx, req)
	fmt.Println(next.Outcome, next.Record.Token > stuck.Record.Token, next.Record.Attempts, next.Record.LastError)
	// Output:
	// <nil>
	// true
	// acquired true 2 worker host-7 died
}
