package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

func Example() {
	// NewUniversalClient gives a *redis.ClusterClient for several addresses.
	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
	defer client.Close()
	defer dropKeys(client, "example:") // keep the shared test server clean
	ctx := context.Background()
	store, err := redisstore.New(ctx, redisstore.Config{Client: client, Prefix: "example:", Namespace: "orders"})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	key := []byte("order-42")

	c, err := store.Claim(ctx, idem.ClaimRequest{Key: key, Lease: 30 * time.Second, TTL: 24 * time.Hour})
	if err != nil {
		panic(err) // ErrUnavailable / ErrUnknownOutcome: do not ack, retry later
	}
	fmt.Println(c.Outcome)
	// ... apply the effect, then record it with the claim's fencing token:
	if err := store.Complete(ctx, key, c.Record.Token, []byte("shipped")); err != nil {
		panic(err)
	}
	again, _ := store.Claim(ctx, idem.ClaimRequest{Key: key, Lease: 30 * time.Second, TTL: 24 * time.Hour})
	fmt.Println(again.Outcome, string(again.Record.Result))
	// Output:
	// acquired
	// completed shipped
}

func dropKeys(c redis.UniversalClient, prefix string) {
	ctx := context.Background()
	it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for it.Next(ctx) {
		c.Del(ctx, it.Val())
	}
}

func ExampleStore_ClaimBatch() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	defer dropKeys(client, "example-batch:")
	ctx := context.Background()
	store, err := redisstore.New(ctx, redisstore.Config{Client: client, Prefix: "example-batch:"})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	claim := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Lease: 30 * time.Second, TTL: time.Hour}
	}
	// One round trip; results in request order, as if claimed one by one.
	res, err := store.ClaimBatch(ctx, []idem.ClaimRequest{claim("m1"), claim("m2"), claim("m1"), {}})
	if err != nil {
		panic(err) // the whole batch failed: ErrUnavailable or ErrUnknownOutcome
	}
	for _, r := range res {
		if r.Err != nil {
			fmt.Println("error:", errors.Is(r.Err, idem.ErrInvalidKey))
			continue
		}
		fmt.Println(r.Claim.Outcome)
	}
	// Output:
	// acquired
	// acquired
	// in_progress
	// error: true
}

func ExampleStore_CompleteBatch() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	defer dropKeys(client, "example-cbatch:")
	ctx := context.Background()
	store, err := redisstore.New(ctx, redisstore.Config{Client: client, Prefix: "example-cbatch:"})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	res, err := store.ClaimBatch(ctx, []idem.ClaimRequest{
		{Key: []byte("m1"), Lease: 30 * time.Second, TTL: time.Hour},
		{Key: []byte("m2"), Lease: 30 * time.Second, TTL: time.Hour},
	})
	if err != nil {
		panic(err)
	}
	// Settle both in one round trip; the third entry carries a stale token.
	errs, err := store.CompleteBatch(ctx, []idem.Completion{
		{Key: []byte("m1"), Token: res[0].Claim.Record.Token, Result: []byte("ok-1")},
		{Key: []byte("m2"), Token: res[1].Claim.Record.Token, Result: []byte("ok-2")},
		{Key: []byte("m2"), Token: res[1].Claim.Record.Token - 1},
	})
	if err != nil {
		panic(err) // the call failed as a whole (any subset may be applied): retry
	}
	for _, e := range errs {
		fmt.Println(e == nil, errors.Is(e, idem.ErrFenced))
	}
	// Output:
	// true false
	// true false
	// false true
}
