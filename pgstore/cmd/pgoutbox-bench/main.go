// Command pgoutbox-bench measures the PostgreSQL outbox (pgoutbox) and its
// relay beside hand-written baselines, in one run, with synchronous_commit
// on:
//
//   - throughput: a relay (outbox.Relay.RunOnce in a loop, publisher that
//     discards) draining -rows pending rows, beside a raw loop doing the same
//     database work by hand (BEGIN; SELECT the same columns ... FOR UPDATE
//     SKIP LOCKED LIMIT batch; UPDATE ... SET status = 1 WHERE id =
//     ANY(...); COMMIT, a round trip each), the same loop pipelined as the
//     relay does it (BEGIN+SELECT, UPDATE+COMMIT: two round trips), and the
//     plain loop selecting only id. Modes take turns round by round, each
//     on a freshly filled, vacuumed table.
//
//   - latency: commit-to-publish times of messages committed one per
//     transaction at -rate per second while a relay runs (Relay.Run), with
//     LISTEN/NOTIFY wake-ups (NOTIFY in the transaction, or after its
//     commit) and, beside them, polling every 100ms and every 10ms.
//     Measured from just before COMMIT to the publisher seeing the message.
//
//   - enqueue: business transactions per second (INSERT an order; COMMIT)
//     beside the same transaction plus Enqueue of one message in each
//     notify mode, and with Queue pipelining the two INSERTs, at each
//     -callers.
//
//     go run ./cmd/pgoutbox-bench                      # all three parts
//     go run ./cmd/pgoutbox-bench -parts throughput -rows 200000 -rounds 5
//
// Everything lives in one schema, dropped at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
	"github.com/idem-dev/idem/snowflake"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type opts struct {
	dsn      string
	parts    []string
	rows     int
	batch    int
	loops    []int
	rounds   int
	payload  int
	msgs     int
	rate     int
	callers  []int
	duration time.Duration
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pgoutbox-bench:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func run(ctx context.Context, args []string, w io.Writer) error {
	var o opts
	var parts, loops, callers string
	fs := flag.NewFlagSet("pgoutbox-bench", flag.ContinueOnError)
	fs.StringVar(&o.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	fs.StringVar(&parts, "parts", "throughput,latency,enqueue", "what to measure")
	fs.IntVar(&o.rows, "rows", 100000, "throughput: pending rows drained per cell")
	fs.IntVar(&o.batch, "batch", 256, "throughput: rows per claim (relay BatchSize, raw LIMIT)")
	fs.StringVar(&loops, "loops", "1,2", "throughput: claim loops (goroutines) per mode")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; the modes take turns in each")
	fs.IntVar(&o.payload, "payload", 256, "payload bytes per message")
	fs.IntVar(&o.msgs, "msgs", 2000, "latency: messages per mode and round")
	fs.IntVar(&o.rate, "rate", 500, "latency: messages committed per second (one per transaction)")
	fs.StringVar(&callers, "callers", "1,8", "enqueue: concurrent business transactions")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "enqueue: time per cell")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.parts = strings.Split(parts, ",")
	var err error
	if o.loops, err = ints(loops); err != nil {
		return err
	}
	if o.callers, err = ints(callers); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var sc string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		return err
	}
	if sc != "on" {
		return fmt.Errorf("synchronous_commit is %q; the figures mean durable commits", sc)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "pgoutbox_bench_" + hex.EncodeToString(b[:])
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	var version string
	_ = pool.QueryRow(ctx, "SELECT version()").Scan(&version)
	fmt.Fprintf(w, "pgoutbox-bench %s\n%s; GOMAXPROCS from the environment; schema %s\n", strings.Join(args, " "), version, schema)
	for _, p := range o.parts {
		var err error
		switch p {
		case "throughput":
			err = throughput(ctx, w, pool, schema, o)
		case "latency":
			err = latency(ctx, w, pool, schema, o)
		case "enqueue":
			err = enqueue(ctx, w, pool, schema, o)
		default:
			err = fmt.Errorf("unknown part %q", p)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newOutbox(ctx context.Context, pool *pgxpool.Pool, schema, table string, mode pgoutbox.NotifyMode) (*pgoutbox.Outbox, error) {
	gen, err := snowflake.New(ctx, snowflake.Config{Worker: 1})
	if err != nil {
		return nil, err
	}
	cfg := pgoutbox.Config{Pool: pool, Schema: schema, Table: table, NewID: gen.NextString, Notify: mode, Logger: quiet}
	if err := pgoutbox.Migrate(ctx, cfg); err != nil {
		return nil, err
	}
	return pgoutbox.New(cfg)
}

type discard struct{}

func (discard) Publish(context.Context, ...*broker.Message) error { return nil }
func (discard) Close() error                                      { return nil }

// ---- throughput ----

func throughput(ctx context.Context, w io.Writer, pool *pgxpool.Pool, schema string, o opts) error {
	ob, err := newOutbox(ctx, pool, schema, "tput", pgoutbox.NotifyOff)
	if err != nil {
		return err
	}
	tbl := pgx.Identifier{schema, "tput"}.Sanitize()
	payload := make([]byte, o.payload)
	_, _ = rand.Read(payload)
	fill := func() error {
		if _, err := pool.Exec(ctx, "TRUNCATE "+tbl); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+tbl+` (id, topic, key, payload, next_attempt_at, created_at, updated_at)
SELECT 'b-' || g, 'bench', '', $1, now() - interval '1 minute', now(), now() FROM generate_series(1, $2) g`, payload, o.rows); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+tbl); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, "CHECKPOINT")
		return err
	}
	type mode struct {
		name  string
		drain func(ctx context.Context) (int, error) // one claim loop until nothing is due
	}
	relay, err := outbox.New(outbox.Config{Backend: ob, Publisher: discard{}, BatchSize: o.batch, Logger: quiet})
	if err != nil {
		return err
	}
	cols := "seq, id, topic, key, headers, payload, attempts, next_attempt_at, created_at, updated_at, last_error"
	rawLoop := func(selectCols string, pipelined bool) func(ctx context.Context) (int, error) {
		q := `SELECT ` + selectCols + ` FROM ` + tbl + ` WHERE status = 0 AND next_attempt_at <= statement_timestamp()
ORDER BY next_attempt_at, seq LIMIT $1 FOR UPDATE SKIP LOCKED`
		// Rows are updated by id, the table's primary key (seq has no index).
		upd := `UPDATE ` + tbl + ` SET status = 1, attempts = attempts + 1, updated_at = statement_timestamp() WHERE id = ANY($1)`
		return func(ctx context.Context) (int, error) {
			total := 0
			seqs := make([]string, 0, o.batch)
			for {
				conn, err := pool.Acquire(ctx)
				if err != nil {
					return total, err
				}
				var rows pgx.Rows
				var br pgx.BatchResults
				if pipelined { // BEGIN and SELECT in one round trip
					b := &pgx.Batch{}
					b.Queue("BEGIN")
					b.Queue(q, o.batch)
					br = conn.SendBatch(ctx, b)
					if _, err = br.Exec(); err == nil {
						rows, err = br.Query()
					}
				} else if _, err = conn.Exec(ctx, "BEGIN"); err == nil {
					rows, err = conn.Query(ctx, q, o.batch)
				}
				if err != nil {
					conn.Release()
					return total, err
				}
				seqs = seqs[:0]
				for rows.Next() {
					if selectCols == "id" {
						var id string
						err = rows.Scan(&id)
						seqs = append(seqs, id)
						continue
					}
					var s int64
					var id, topic, lastErr string
					var key, hdr, pl []byte
					var attempts int
					var next, created, updated time.Time
					err = rows.Scan(&s, &id, &topic, &key, &hdr, &pl, &attempts, &next, &created, &updated, &lastErr)
					seqs = append(seqs, id)
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
				if br != nil {
					if cerr := br.Close(); err == nil {
						err = cerr
					}
				}
				if err != nil || len(seqs) == 0 {
					_, _ = conn.Exec(ctx, "ROLLBACK")
					conn.Release()
					return total, err
				}
				if pipelined { // UPDATE and COMMIT in one round trip
					b := &pgx.Batch{}
					b.Queue(upd, seqs)
					b.Queue("COMMIT")
					err = conn.SendBatch(ctx, b).Close()
				} else if _, err = conn.Exec(ctx, upd, seqs); err == nil {
					_, err = conn.Exec(ctx, "COMMIT")
				}
				conn.Release()
				if err != nil {
					return total, err
				}
				total += len(seqs)
			}
		}
	}
	modes := []mode{
		{"relay", func(ctx context.Context) (int, error) {
			total := 0
			for {
				n, err := relay.RunOnce(ctx)
				total += n
				if err != nil || n == 0 {
					return total, err
				}
			}
		}},
		{"raw", rawLoop(cols, false)},
		{"raw-pipelined", rawLoop(cols, true)},
		{"raw-id-only", rawLoop("id", false)},
	}
	fmt.Fprintf(w, "\n## throughput: drain %d pending rows (payload %d B), batch %d, publisher discards\n", o.rows, o.payload, o.batch)
	results := map[string][]float64{} // "mode xloops" -> msgs/s per round
	for round := 0; round < o.rounds; round++ {
		order := slices.Clone(modes)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, loops := range o.loops {
			for _, m := range order {
				if err := fill(); err != nil {
					return err
				}
				var done atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, loops)
				cpu0 := cpuTime()
				start := time.Now()
				for range loops {
					wg.Go(func() {
						n, err := m.drain(ctx)
						done.Add(int64(n))
						if err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				el := time.Since(start)
				cpu := cpuTime() - cpu0
				close(errs)
				if err := <-errs; err != nil {
					return fmt.Errorf("%s: %w", m.name, err)
				}
				if int(done.Load()) != o.rows {
					return fmt.Errorf("%s x%d drained %d of %d rows", m.name, loops, done.Load(), o.rows)
				}
				key := fmt.Sprintf("%s x%d", m.name, loops)
				rate := float64(o.rows) / el.Seconds()
				results[key] = append(results[key], rate)
				fmt.Fprintf(w, "round %d %-18s %9.0f msgs/s (%s; client CPU %.1f µs/msg)\n", round+1, key, rate, el.Round(time.Millisecond),
					float64(cpu.Microseconds())/float64(o.rows))
			}
		}
	}
	fmt.Fprintf(w, "\n| mode | loops | msgs/s median (min-max) | relay / raw, relay / raw-pipelined (medians of per-round ratios) |\n| --- | ---: | ---: | ---: |\n")
	for _, loops := range o.loops {
		for _, m := range modes {
			key := fmt.Sprintf("%s x%d", m.name, loops)
			rs := results[key]
			ratio := ""
			if m.name == "relay" {
				var per, perP []float64
				for i, r := range rs {
					per = append(per, r/results[fmt.Sprintf("raw x%d", loops)][i])
					perP = append(perP, r/results[fmt.Sprintf("raw-pipelined x%d", loops)][i])
				}
				ratio = fmt.Sprintf("%.2f, %.2f (per round: %s)", median(per), median(perP), ratios(per))
			}
			fmt.Fprintf(w, "| %s | %d | %.0f (%.0f-%.0f) | %s |\n", m.name, loops, median(rs), slices.Min(rs), slices.Max(rs), ratio)
		}
	}
	return nil
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ratios(v []float64) string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(out, " ")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ---- latency ----

type stampPublisher struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (p *stampPublisher) Publish(_ context.Context, msgs ...*broker.Message) error {
	now := time.Now()
	p.mu.Lock()
	for _, m := range msgs {
		if _, ok := p.at[m.ID]; !ok {
			p.at[m.ID] = now
		}
	}
	p.mu.Unlock()
	return nil
}
func (p *stampPublisher) Close() error { return nil }

func (p *stampPublisher) count() int { p.mu.Lock(); defer p.mu.Unlock(); return len(p.at) }

func latency(ctx context.Context, w io.Writer, pool *pgxpool.Pool, schema string, o opts) error {
	fmt.Fprintf(w, "\n## latency: commit-to-publish, %d messages per cell, one per transaction, %d/s\n", o.msgs, o.rate)
	type cell struct {
		name string
		mode pgoutbox.NotifyMode
		poll time.Duration
	}
	cells := []cell{{"notify in tx", pgoutbox.NotifyInTx, 0}, {"notify after commit", pgoutbox.NotifyAfterCommit, 0},
		{"poll 100ms", pgoutbox.NotifyOff, 0}, {"poll 10ms", pgoutbox.NotifyOff, 10 * time.Millisecond}}
	results := map[string][]time.Duration{}
	for round := 0; round < o.rounds; round++ {
		for i, c := range cells {
			table := fmt.Sprintf("lat_%d_%d", round, i)
			ob, err := newOutbox(ctx, pool, schema, table, c.mode)
			if err != nil {
				return err
			}
			pub := &stampPublisher{at: map[string]time.Time{}}
			relay, err := outbox.New(outbox.Config{Backend: ob, Publisher: pub, PollInterval: c.poll, Logger: quiet})
			if err != nil {
				return err
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- relay.Run(rctx) }()
			time.Sleep(200 * time.Millisecond) // LISTEN established
			committing := make(map[string]time.Time, o.msgs)
			tick := time.NewTicker(time.Second / time.Duration(o.rate))
			payload := make([]byte, o.payload)
			for range o.msgs {
				<-tick.C
				tx, err := pool.Begin(ctx)
				if err != nil {
					cancel()
					return err
				}
				ids, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "lat", Payload: payload})
				if err != nil {
					cancel()
					return err
				}
				t0 := time.Now()
				if err := tx.Commit(ctx); err != nil {
					cancel()
					return err
				}
				ob.Notify()
				committing[ids[0]] = t0
			}
			tick.Stop()
			deadline := time.Now().Add(time.Minute)
			for pub.count() < o.msgs && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				return err
			}
			ob.Close()
			if pub.count() < o.msgs {
				return fmt.Errorf("%s: %d of %d published", c.name, pub.count(), o.msgs)
			}
			lats := make([]time.Duration, 0, o.msgs)
			pub.mu.Lock()
			for id, t0 := range committing {
				lats = append(lats, max(pub.at[id].Sub(t0), 0))
			}
			pub.mu.Unlock()
			slices.Sort(lats)
			results[c.name] = append(results[c.name], lats...)
			fmt.Fprintf(w, "round %d %-19s p50 %6s p90 %6s p99 %6s max %6s\n", round+1, c.name,
				pct(lats, 0.50), pct(lats, 0.90), pct(lats, 0.99), lats[len(lats)-1].Round(10*time.Microsecond))
		}
	}
	fmt.Fprintf(w, "\n| wake-up | messages | p50 | p90 | p99 | max |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, c := range cells {
		l := results[c.name]
		slices.Sort(l)
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s |\n", c.name, len(l), pct(l, 0.5), pct(l, 0.9), pct(l, 0.99), l[len(l)-1].Round(10*time.Microsecond))
	}
	return nil
}

func pct(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted)-1) * p)
	return sorted[i].Round(10 * time.Microsecond)
}

// ---- enqueue overhead ----

func enqueue(ctx context.Context, w io.Writer, pool *pgxpool.Pool, schema string, o opts) error {
	obN, err := newOutbox(ctx, pool, schema, "enq_notify", pgoutbox.NotifyInTx)
	if err != nil {
		return err
	}
	obA, err := newOutbox(ctx, pool, schema, "enq_after", pgoutbox.NotifyAfterCommit)
	if err != nil {
		return err
	}
	defer obA.Close()
	obP, err := newOutbox(ctx, pool, schema, "enq_poll", pgoutbox.NotifyOff)
	if err != nil {
		return err
	}
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+orders+` (id bigserial PRIMARY KEY, customer int NOT NULL, amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	payload := make([]byte, o.payload)
	type mode struct {
		name      string
		ob        *pgoutbox.Outbox
		pipelined bool // the order INSERT and Queue's statements in one batch
	}
	modes := []mode{{"business tx only", nil, false}, {"+ Enqueue (notify in tx)", obN, false},
		{"+ Enqueue (notify after commit)", obA, false}, {"+ Enqueue (no notify)", obP, false},
		{"+ Queue, pipelined (after commit)", obA, true}}
	fmt.Fprintf(w, "\n## enqueue: business transactions (INSERT an order; COMMIT) with and without Enqueue of one %d B message, %s per cell\n", o.payload, o.duration)
	results := map[string][]float64{}
	for round := 0; round < o.rounds; round++ {
		order := slices.Clone(modes)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, callers := range o.callers {
			for _, m := range order {
				for _, t := range []string{orders, pgx.Identifier{schema, "enq_notify"}.Sanitize(), pgx.Identifier{schema, "enq_after"}.Sanitize(), pgx.Identifier{schema, "enq_poll"}.Sanitize()} {
					if _, err := pool.Exec(ctx, "TRUNCATE "+t); err != nil {
						return err
					}
				}
				var n atomic.Int64
				var failed atomic.Value
				cctx, cancel := context.WithTimeout(ctx, o.duration)
				var wg sync.WaitGroup
				for c := range callers {
					wg.Go(func() {
						for cctx.Err() == nil {
							err := pgx.BeginFunc(cctx, pool, func(tx pgx.Tx) error {
								msg := outbox.Message{Topic: "orders", Key: []byte("customer-" + strconv.Itoa(c)), Payload: payload}
								if m.pipelined {
									b := &pgx.Batch{}
									b.Queue(`INSERT INTO `+orders+` (customer, amount) VALUES ($1, $2)`, c, 100)
									if _, err := m.ob.Queue(cctx, b, msg); err != nil {
										return err
									}
									return tx.SendBatch(cctx, b).Close()
								}
								if _, err := tx.Exec(cctx, `INSERT INTO `+orders+` (customer, amount) VALUES ($1, $2)`, c, 100); err != nil {
									return err
								}
								if m.ob != nil {
									_, err := m.ob.Enqueue(cctx, tx, msg)
									return err
								}
								return nil
							})
							if err == nil {
								if m.ob != nil {
									m.ob.Notify()
								}
								n.Add(1)
							} else if cctx.Err() == nil {
								failed.Store(err)
								return
							}
						}
					})
				}
				wg.Wait()
				cancel()
				if e := failed.Load(); e != nil {
					return fmt.Errorf("%s: %v", m.name, e)
				}
				key := fmt.Sprintf("%s x%d", m.name, callers)
				rate := float64(n.Load()) / o.duration.Seconds()
				results[key] = append(results[key], rate)
				fmt.Fprintf(w, "round %d %-38s %8.0f tx/s\n", round+1, key, rate)
			}
		}
	}
	fmt.Fprintf(w, "\n| transaction | callers | tx/s median (min-max) | vs business tx only (median of per-round ratios) |\n| --- | ---: | ---: | ---: |\n")
	for _, callers := range o.callers {
		for _, m := range modes {
			key := fmt.Sprintf("%s x%d", m.name, callers)
			rs := results[key]
			var per []float64
			for i, r := range rs {
				per = append(per, r/results[fmt.Sprintf("business tx only x%d", callers)][i])
			}
			fmt.Fprintf(w, "| %s | %d | %.0f (%.0f-%.0f) | %.2f |\n", m.name, callers, median(rs), slices.Min(rs), slices.Max(rs), median(per))
		}
	}
	return nil
}
