package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkDoTxCompletion compares DoTx's completion statement (which also
// reads the transaction id and sets idle_in_transaction_session_timeout,
// for resolving a lost COMMIT) with the plain completion, each in a
// transaction that claims, completes and commits, as DoTx does. Each
// iteration runs one of each, alternately, so load from elsewhere on the
// machine hits both alike; it reports both times and their ratio:
//
//	flock /tmp/bench.lock go test -run '^$' -bench DoTxCompletion -count 6 . | tee b.txt
//
// The benchmark's own sessions commit with synchronous_commit off, so the
// WAL flush (milliseconds on a shared disk, and noisy) does not drown the
// difference between the statements.
func BenchmarkDoTxCompletion(b *testing.B) {
	pc, err := pgxpool.ParseConfig(testDSN())
	if err != nil {
		b.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	ctx := context.Background()
	cfg := Config{Pool: pool, Schema: internalSchema(b, pool), Table: "bench"}
	if err := Migrate(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	one := func(key string, withXid bool) time.Duration {
		start := time.Now()
		r, _ := s.ref([]byte(key))
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c, err := s.claim(ctx, tx, r, idem.ClaimRequest{Key: r.key, Lease: time.Minute, TTL: time.Hour}, true)
		if err != nil {
			b.Fatal(err)
		}
		var xid string
		var xp *string
		if withXid {
			xp = &xid
		}
		if err := s.mutateX(ctx, tx, mutComplete, r, c.Record.Token, []byte("r"), true, xp); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var plain, withXid time.Duration
	i := 0
	for b.Loop() {
		i++
		k := fmt.Sprintf("%d-%d", time.Now().UnixNano(), i)
		if i%2 == 0 {
			plain += one("p"+k, false)
			withXid += one("x"+k, true)
		} else {
			withXid += one("x"+k, true)
			plain += one("p"+k, false)
		}
	}
	b.ReportMetric(float64(plain.Nanoseconds())/float64(i), "plain-ns/tx")
	b.ReportMetric(float64(withXid.Nanoseconds())/float64(i), "xid-ns/tx")
	b.ReportMetric(float64(withXid)/float64(plain), "xid/plain")
}
