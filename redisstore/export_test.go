package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RecordKey is the Redis key of key's record in s (tests only: they damage
// records on purpose).
func (s *Store) RecordKey(key []byte) string {
	rk, _ := s.keysOf(key)
	return rk
}

// sharedForInternal connects the package's own tests to the shared Redis
// (failing when it is down) and returns a key prefix of their own, whose
// keys are removed in cleanup.
func sharedForInternal(t *testing.T, name string) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at 127.0.0.1:6379 unreachable: %v", err)
	}
	prefix := "idemtest-" + name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	t.Cleanup(func() {
		keys, _ := c.Keys(context.Background(), prefix+"*").Result()
		for _, k := range keys {
			c.Unlink(context.Background(), k)
		}
	})
	return c, prefix
}
