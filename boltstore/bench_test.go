package boltstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

// BenchmarkClaim measures new-key claims per second with 1, 8 and 64
// concurrent callers, one key per call (single) or 100 per call (batch),
// for the memory store, this store under both fsync policies and the
// baseline the group commit is measured against: one bbolt Update (and so
// one fsync) per claim. Run them in one go so that the ratios compare like
// with like on a shared machine (see docs/benchmarks/boltstore.md).
func BenchmarkClaim(b *testing.B) {
	type target struct {
		name string
		open func(b *testing.B) claimer
	}
	targets := []target{
		{"memstore", func(b *testing.B) claimer {
			s, err := memstore.New(memstore.Config{MaxEntries: 1 << 30, SweepInterval: -1})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return storeClaimer{s}
		}},
		{"boltstore-group", func(b *testing.B) claimer { return storeClaimer{benchStore(b, FsyncGroup)} }},
		{"boltstore-always", func(b *testing.B) claimer { return storeClaimer{benchStore(b, FsyncAlways)} }},
		{"bbolt-update-per-claim", openBaseline},
	}
	for _, mode := range []struct {
		name  string
		batch int
	}{{"single", 1}, {"batch100", 100}} {
		for _, conc := range []int{1, 8, 64} {
			for _, tg := range targets {
				b.Run(fmt.Sprintf("%s/callers=%d/%s", mode.name, conc, tg.name), func(b *testing.B) {
					c := tg.open(b)
					benchClaims(b, c, conc, mode.batch)
					if sc, ok := c.(storeClaimer); ok {
						if bs, ok := sc.s.(*Store); ok && bs.b.commits.Load() > 0 {
							b.ReportMetric(float64(bs.b.committedOps.Load())/float64(bs.b.commits.Load()), "ops/commit")
						}
					}
				})
			}
		}
	}
}

type claimer interface {
	claim(ctx context.Context, reqs []idem.ClaimRequest) error
}

type storeClaimer struct{ s idem.Store }

func (c storeClaimer) claim(ctx context.Context, reqs []idem.ClaimRequest) error {
	if len(reqs) == 1 {
		cl, err := c.s.Claim(ctx, reqs[0])
		if err == nil && cl.Outcome != idem.OutcomeAcquired {
			err = fmt.Errorf("outcome %s", cl.Outcome)
		}
		return err
	}
	res, err := c.s.(idem.BatchClaimer).ClaimBatch(ctx, reqs)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

func benchStore(b *testing.B, fsync FsyncPolicy) idem.Store {
	s, err := Open(Config{Path: filepath.Join(b.TempDir(), "bench.db"), Fsync: fsync, SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// baseline is the naive durable store: each claim is its own bbolt Update,
// with the same insert-if-absent logic and record encoding, and bbolt's
// default fsync on commit.
type baseline struct{ db *bbolt.DB }

func openBaseline(b *testing.B) claimer {
	db, err := bbolt.Open(filepath.Join(b.TempDir(), "baseline.db"), 0o600, &bbolt.Options{FreelistType: bbolt.FreelistMapType})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("r")); return err }); err != nil {
		b.Fatal(err)
	}
	return baseline{db}
}

func (bl baseline) claim(_ context.Context, reqs []idem.ClaimRequest) error {
	for _, req := range reqs {
		err := bl.db.Update(func(tx *bbolt.Tx) error {
			bk := tx.Bucket([]byte("r"))
			if bk.Get(req.Key) != nil {
				return fmt.Errorf("key %q exists", req.Key)
			}
			tok, err := bk.NextSequence()
			if err != nil {
				return err
			}
			now := time.Now().UnixNano()
			r := rec{state: idem.StateInProgress, token: tok, attempts: 1, ttl: int64(req.TTL), leaseUntil: now + int64(req.Lease), expiresAt: now + int64(req.TTL), created: now, updated: now}
			return bk.Put(req.Key, r.encode(req.Key))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// benchClaims makes b.N claims of new keys from conc goroutines, batch keys
// per call, and reports claims/s.
func benchClaims(b *testing.B, c claimer, conc, batch int) {
	benchClaimKeys(b, c, conc, batch, func(i int64) []byte { return strconv.AppendInt([]byte("key-"), i, 10) })
}

// benchClaimKeys is benchClaims with the key of claim i given by key.
func benchClaimKeys(b *testing.B, c claimer, conc, batch int, key func(i int64) []byte) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	b.ResetTimer()
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]idem.ClaimRequest, 0, batch)
			for {
				first := next.Add(int64(batch)) - int64(batch)
				if first >= int64(b.N) {
					return
				}
				reqs = reqs[:0]
				for i := first; i < min(first+int64(batch), int64(b.N)); i++ {
					reqs = append(reqs, idem.ClaimRequest{Key: key(i), Lease: time.Minute, TTL: time.Hour})
				}
				if err := c.claim(ctx, reqs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "claims/s")
}

// BenchmarkLinger shows what the commit loop's short wait for stragglers
// buys: single claims from 64 callers with and without it.
func BenchmarkLinger(b *testing.B) {
	for _, tc := range []struct {
		name   string
		linger time.Duration
	}{{"linger=500us", 0}, {"linger=off", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := Open(Config{Path: filepath.Join(b.TempDir(), "bench.db"), SweepInterval: -1, MaxLinger: tc.linger})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			benchClaims(b, storeClaimer{s}, 64, 1)
			b.ReportMetric(float64(s.b.committedOps.Load())/float64(s.b.commits.Load()), "ops/commit")
		})
	}
}

// BenchmarkDuplicate measures claims of keys already completed (the replay
// path, the common case of an idempotency store): answered from a read
// transaction, no commit. 64 callers, beside the memory store.
func BenchmarkDuplicate(b *testing.B) {
	for _, tg := range []string{"memstore", "boltstore"} {
		b.Run(tg, func(b *testing.B) {
			var s idem.Store
			if tg == "memstore" {
				m, err := memstore.New(memstore.Config{SweepInterval: -1})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { m.Close() })
				s = m
			} else {
				s = benchStore(b, FsyncGroup)
			}
			ctx := context.Background()
			const keys = 1000
			reqs := make([]idem.ClaimRequest, keys)
			for i := range reqs {
				reqs[i] = idem.ClaimRequest{Key: strconv.AppendInt([]byte("dup-"), int64(i), 10), Lease: time.Minute, TTL: time.Hour}
			}
			res, err := s.(idem.BatchClaimer).ClaimBatch(ctx, reqs)
			if err != nil {
				b.Fatal(err)
			}
			for i, r := range res {
				if err := s.Complete(ctx, reqs[i].Key, r.Claim.Record.Token, []byte("done")); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			b.SetParallelism(32) // 64 goroutines on 2 CPUs
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c, err := s.Claim(ctx, reqs[next.Add(1)%keys])
					if err != nil || c.Outcome != idem.OutcomeCompleted {
						b.Errorf("%v %v", c.Outcome, err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "claims/s")
		})
	}
}

// BenchmarkDuplicateUnderWrites measures duplicate claims (answered from a
// read transaction) from 64 goroutines while 16 others claim new keys, so
// that commits run back to back, alternating in rounds on one store between
// readers that wait for the fdatasync of a commit whose meta page they would
// otherwise already see (wait=on, the store's behaviour) and readers that
// answer from it at once (wait=off, the behaviour before, which a power cut
// could contradict). Alternating rounds in one run keeps the comparison fair
// on a shared machine. Run it with -benchtime 1x; it reports each mode's
// duplicates/s and new claims/s, and their ratios on/off.
func BenchmarkDuplicateUnderWrites(b *testing.B) {
	const rounds, round = 10, 500 * time.Millisecond
	s := benchStore(b, FsyncGroup).(*Store)
	var waits atomic.Int64
	s.b.readerWaits = func() { waits.Add(1) }
	ctx := context.Background()
	const keys = 1000
	reqs := make([]idem.ClaimRequest, keys)
	for i := range reqs {
		reqs[i] = idem.ClaimRequest{Key: strconv.AppendInt([]byte("dup-"), int64(i), 10), Lease: time.Minute, TTL: time.Hour}
	}
	res, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		b.Fatal(err)
	}
	for i, r := range res {
		if err := s.Complete(ctx, reqs[i].Key, r.Claim.Record.Token, []byte("done")); err != nil {
			b.Fatal(err)
		}
	}
	var dups, writes [2]atomic.Int64 // [0] wait=on, [1] wait=off
	var mode atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m := mode.Load()
				if _, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte(fmt.Sprintf("new-%d-%d", w, i)), Lease: time.Minute, TTL: time.Hour}); err != nil {
					b.Error(err)
					return
				}
				writes[m].Add(1)
			}
		}()
	}
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m := mode.Load()
				c, err := s.Claim(ctx, reqs[i%keys])
				if err != nil || c.Outcome != idem.OutcomeCompleted {
					b.Errorf("%v %v", c.Outcome, err)
					return
				}
				dups[m].Add(1)
			}
		}()
	}
	b.ResetTimer()
	for r := range 2 * rounds {
		m := int32(r % 2)
		s.b.readUnsynced.Store(m == 1)
		mode.Store(m)
		time.Sleep(round)
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	secs := (rounds * round).Seconds()
	on, off := float64(dups[0].Load())/secs, float64(dups[1].Load())/secs
	won, woff := float64(writes[0].Load())/secs, float64(writes[1].Load())/secs
	b.ReportMetric(on, "dups/s(wait=on)")
	b.ReportMetric(off, "dups/s(wait=off)")
	b.ReportMetric(on/off, "dups-on/off")
	b.ReportMetric(won, "writes/s(wait=on)")
	b.ReportMetric(woff, "writes/s(wait=off)")
	b.ReportMetric(won/woff, "writes-on/off")
	b.ReportMetric(float64(waits.Load()), "reader-waits")
}

// BenchmarkClaimRandomKeys is BenchmarkClaim's 64-caller rows with random
// 16-byte keys (UUID-like) instead of increasing ones (Snowflake-like): each
// claim then dirties its own leaf pages, so commits write more.
func BenchmarkClaimRandomKeys(b *testing.B) {
	random := func(i int64) []byte {
		var k [16]byte
		binary.LittleEndian.PutUint64(k[:], uint64(i)*0x9E3779B97F4A7C15)
		binary.LittleEndian.PutUint64(k[8:], uint64(i)*0xC2B2AE3D27D4EB4F^0x165667B19E3779F9)
		return k[:]
	}
	for _, batch := range []int{1, 100} {
		for _, tg := range []struct {
			name string
			open func(b *testing.B) claimer
		}{
			{"boltstore-group", func(b *testing.B) claimer { return storeClaimer{benchStore(b, FsyncGroup)} }},
			{"bbolt-update-per-claim", openBaseline},
		} {
			b.Run(fmt.Sprintf("batch=%d/callers=64/%s", batch, tg.name), func(b *testing.B) {
				benchClaimKeys(b, tg.open(b), 64, batch, random)
			})
		}
	}
}

// BenchmarkClaimManyCallers: single claims from 512 callers (a consumer with
// many handlers in flight). Group commit carries up to one claim per caller,
// so more callers fill commits further.
func BenchmarkClaimManyCallers(b *testing.B) {
	for _, tg := range []struct {
		name string
		open func(b *testing.B) claimer
	}{
		{"boltstore-group", func(b *testing.B) claimer { return storeClaimer{benchStore(b, FsyncGroup)} }},
		{"bbolt-update-per-claim", openBaseline},
	} {
		b.Run("callers=512/"+tg.name, func(b *testing.B) {
			c := tg.open(b)
			benchClaims(b, c, 512, 1)
			if sc, ok := c.(storeClaimer); ok {
				bs := sc.s.(*Store)
				b.ReportMetric(float64(bs.b.committedOps.Load())/float64(bs.b.commits.Load()), "ops/commit")
			}
		})
	}
}

// BenchmarkCompleteBatch measures settling held claims, the second half of a
// batch consumer: each operation completes 100 claims the caller holds,
// either with one CompleteBatch (one commit-loop operation) or with 100
// Completes one after another (what Guard.CompleteBatch does on a store
// without idem.BatchCompleter), from 1 and from 64 concurrent callers. Each
// round first claims 100 fresh keys per caller (untimed), then times only the
// completions of all callers together. ops/commit counts the timed phase.
func BenchmarkCompleteBatch(b *testing.B) {
	const per = 100
	for _, conc := range []int{1, 64} {
		for _, mode := range []string{"batch", "single"} {
			b.Run(fmt.Sprintf("callers=%d/%s", conc, mode), func(b *testing.B) {
				s := benchStore(b, FsyncGroup).(*Store)
				ctx := context.Background()
				all := func(n int, fn func(i int) error) {
					var wg sync.WaitGroup
					for i := range n {
						wg.Go(func() {
							if err := fn(i); err != nil {
								b.Error(err)
							}
						})
					}
					wg.Wait()
				}
				var (
					seq       atomic.Int64
					timed     time.Duration
					completed int
					commits   int64
					ops       int64
				)
				b.StopTimer()
				for left := b.N; left > 0 && !b.Failed(); left -= conc {
					n := min(conc, left)
					held := make([][]idem.Completion, n)
					all(n, func(i int) error {
						reqs := make([]idem.ClaimRequest, per)
						for j := range reqs {
							reqs[j] = idem.ClaimRequest{Key: strconv.AppendInt([]byte("cb-"), seq.Add(1), 10), Lease: time.Minute, TTL: time.Hour}
						}
						res, err := s.ClaimBatch(ctx, reqs)
						if err != nil {
							return err
						}
						held[i] = make([]idem.Completion, per)
						for j, r := range res {
							if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
								return fmt.Errorf("claim: %v %v", r.Claim.Outcome, r.Err)
							}
							held[i][j] = idem.Completion{Key: reqs[j].Key, Token: r.Claim.Record.Token, Result: []byte("ok")}
						}
						return nil
					})
					c0, o0 := s.b.commits.Load(), s.b.committedOps.Load()
					start := time.Now()
					b.StartTimer()
					all(n, func(i int) error {
						if mode == "batch" {
							errs, err := s.CompleteBatch(ctx, held[i])
							if err != nil {
								return err
							}
							for _, e := range errs {
								if e != nil {
									return e
								}
							}
							return nil
						}
						for _, c := range held[i] {
							if err := s.Complete(ctx, c.Key, c.Token, c.Result); err != nil {
								return err
							}
						}
						return nil
					})
					b.StopTimer()
					timed += time.Since(start)
					commits += s.b.commits.Load() - c0
					ops += s.b.committedOps.Load() - o0
					completed += n * per
				}
				b.ReportMetric(float64(completed)/timed.Seconds(), "completions/s")
				if commits > 0 {
					b.ReportMetric(float64(ops)/float64(commits), "ops/commit")
				}
			})
		}
	}
}
