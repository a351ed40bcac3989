package idem_test

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

// The guard's claim+complete path over the memory store, beside the two
// baselines a hand-rolled deduplicator would use: a sharded map with a
// mutex per shard, and sync.Map. Each op is one new key: insert-if-absent,
// then mark done. Run with:
//
//	go test -run '^$' -bench ClaimComplete -benchmem -count 10 . | tee bench.txt; benchstat bench.txt

var gid atomic.Uint64

// keys yields unique 16-byte keys for one goroutine.
type keys struct {
	buf [16]byte
	n   uint64
}

func newKeys() *keys {
	k := &keys{}
	binary.BigEndian.PutUint64(k.buf[:8], gid.Add(1)<<32|uint64(time.Now().UnixNano()&0xffffffff))
	return k
}

func (k *keys) next() []byte {
	k.n++
	binary.BigEndian.PutUint64(k.buf[8:], k.n)
	return k.buf[:]
}

type rec struct {
	done   bool
	result []byte
}

type shardedMap struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.Mutex
		m  map[string]*rec
		_  [40]byte
	}
}

func newShardedMap() *shardedMap {
	s := &shardedMap{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].m = map[string]*rec{}
	}
	return s
}

func (s *shardedMap) claimComplete(key, result []byte) bool {
	sh := &s.shards[maphash.Bytes(s.seed, key)&63]
	sh.mu.Lock()
	if _, ok := sh.m[string(key)]; ok {
		sh.mu.Unlock()
		return false
	}
	sh.m[string(key)] = &rec{}
	sh.mu.Unlock()
	sh.mu.Lock()
	r := sh.m[string(key)]
	r.done, r.result = true, result
	sh.mu.Unlock()
	return true
}

func parallel(b *testing.B, p int, op func(k *keys)) {
	b.SetParallelism(p)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := newKeys()
		for pb.Next() {
			op(k)
		}
	})
}

func BenchmarkClaimComplete(b *testing.B) {
	result := []byte("ok")
	fn := func(context.Context) ([]byte, error) { return result, nil }
	for _, p := range []int{1, 2} {
		suffix := map[int]string{1: "/g=1xcores", 2: "/g=2xcores"}[p]
		b.Run("shardedmap"+suffix, func(b *testing.B) {
			m := newShardedMap()
			parallel(b, p, func(k *keys) {
				if !m.claimComplete(k.next(), result) {
					b.Fatal("duplicate")
				}
			})
		})
		b.Run("syncmap"+suffix, func(b *testing.B) {
			var m sync.Map
			parallel(b, p, func(k *keys) {
				key := string(k.next())
				if _, loaded := m.LoadOrStore(key, &rec{}); loaded {
					b.Fatal("duplicate")
				}
				m.Store(key, &rec{done: true, result: result})
			})
		})
		for _, hb := range []struct {
			name string
			opt  idem.Option
		}{{"guard", idem.WithHeartbeat(0)}, {"guard-noheartbeat", idem.WithHeartbeat(-1)}} {
			b.Run(hb.name+suffix, func(b *testing.B) {
				s, _ := memstore.New(memstore.Config{MaxEntries: 1 << 30, SweepInterval: -1})
				defer s.Close()
				g, _ := idem.NewGuard(s, hb.opt)
				ctx := context.Background()
				parallel(b, p, func(k *keys) {
					if r, err := g.Do(ctx, k.next(), fn); err != nil || r.Replayed {
						b.Fatal(err)
					}
				})
			})
		}
		b.Run("memstore-raw"+suffix, func(b *testing.B) {
			s, _ := memstore.New(memstore.Config{MaxEntries: 1 << 30, SweepInterval: -1})
			defer s.Close()
			ctx := context.Background()
			parallel(b, p, func(k *keys) {
				key := k.next()
				c, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Lease: time.Minute, TTL: time.Hour})
				if err != nil || c.Outcome != idem.OutcomeAcquired {
					b.Fatal(err)
				}
				if err := s.Complete(ctx, key, c.Record.Token, result); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
