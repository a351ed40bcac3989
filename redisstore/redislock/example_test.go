package redislock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-dev/idem/redisstore/redislock"
	"github.com/redis/go-redis/v9"
)

func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	defer client.Del(context.Background(), "example-lock:{nightly-report}:m") // keep the shared server clean
	locks, err := redislock.New(redislock.Config{Client: client, Prefix: "example-lock:", TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	lk, err := locks.Acquire(ctx, "nightly-report")
	if err != nil {
		panic(err)
	}
	work, stop := context.WithCancel(ctx)
	lk.StartWatchdog(work) // renews every TTL/3 while the work runs
	// Do the work, passing lk.Fence to the resource so that it can reject a
	// holder that lost the lock (see the package doc). Stop on <-lk.Lost().
	stop()
	if err := lk.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("fenced:", lk.Fence > 0)
	// Output: fenced: true
}
