package boltstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
)

func Example() {
	dir, _ := os.MkdirTemp("", "boltstore-example")
	defer os.RemoveAll(dir)

	s, err := boltstore.Open(boltstore.Config{Path: filepath.Join(dir, "idem.db")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	ctx := context.Background()
	req := idem.ClaimRequest{Key: []byte("order-42"), Lease: 30 * time.Second, TTL: 24 * time.Hour}

	c, _ := s.Claim(ctx, req)
	fmt.Println(c.Outcome)
	// ... do the effect, then record it (durable once Complete returns):
	_ = s.Complete(ctx, req.Key, c.Record.Token, []byte("shipped"))

	dup, _ := s.Claim(ctx, req)
	fmt.Println(dup.Outcome, string(dup.Record.Result))
	// Output:
	// acquired
	// completed shipped
}

// Several namespaces share one file (and its commit loop).
func ExampleStore_Namespace() {
	dir, _ := os.MkdirTemp("", "boltstore-example")
	defer os.RemoveAll(dir)
	orders, err := boltstore.Open(boltstore.Config{Path: filepath.Join(dir, "idem.db"), Namespace: "orders"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer orders.Close() // closes the file for every namespace
	mails, _ := orders.Namespace("mails")
	req := idem.ClaimRequest{Key: []byte("42"), Lease: time.Minute, TTL: time.Hour}
	a, _ := orders.Claim(context.Background(), req)
	b, _ := mails.Claim(context.Background(), req)
	fmt.Println(a.Outcome, b.Outcome)
	// Output: acquired acquired
}
