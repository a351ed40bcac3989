// Command pgbench-idem measures pgstore claims against a raw multi-row
// INSERT ... ON CONFLICT DO NOTHING and against the seeds' approach (per
// message: SELECT COUNT(*) ... WHERE CONCAT(...) = ?, then INSERT), on
// tables bulk-filled to -rows rows, with synchronous_commit on.
//
//	go run ./cmd/pgbench-idem                       # quick: 100k rows, 3s per cell
//	go run ./cmd/pgbench-idem -rows 10000000 -duration 10s -callers 1,8,64
//
// Everything it creates lives in one schema that it drops at the end.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type opts struct {
	dsn      string
	rows     int64
	duration time.Duration
	layouts  []string
	callers  []int
	modes    []string
	batch    int
	shards   int
	seedMax  int
	keep     bool
	rounds   int
	procs    []int // GOMAXPROCS settings taking turns round by round (0: leave as is)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pgbench-idem:", err)
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pgbench-idem", flag.ContinueOnError)
	var o opts
	var layouts, callers, modes, procs string
	fs.StringVar(&o.dsn, "dsn", envOr("PGSTORE_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN")
	fs.Int64Var(&o.rows, "rows", 100_000, "rows bulk-filled into each table before measuring")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measuring time per cell")
	fs.StringVar(&layouts, "layouts", "single,sharded,time_partitioned,time_ordered", "layouts to measure")
	fs.StringVar(&callers, "callers", "1,8,32", "concurrent callers per cell")
	fs.StringVar(&modes, "modes", "single,batch,raw,raw1,seed", "single (Claim), batch (ClaimBatch), raw (multi-row INSERT ON CONFLICT DO NOTHING), raw1 (one-row INSERT ON CONFLICT DO NOTHING per commit), seed (COUNT(*) CONCAT then INSERT); also rawret (raw plus RETURNING), fastsql (ClaimBatch's statement without its client work)")
	fs.IntVar(&o.batch, "batch", 100, "batch size for batch and raw")
	fs.IntVar(&o.shards, "shards", 16, "shards for the sharded layout")
	fs.IntVar(&o.seedMax, "seed-callers", 8, "at most this many callers for the seed approach (each call scans the table)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per cell; modes alternate round by round")
	fs.BoolVar(&o.keep, "keep", false, "keep the schema (default: drop it)")
	fs.StringVar(&procs, "procs", "0", "GOMAXPROCS settings for this client, e.g. 2,1: every mode runs under each in turn, round by round, in the same run (0: leave as set by the GOMAXPROCS env var or the runtime)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of this process (the client side) here")
	memprofile := fs.String("memprofile", "", "write an allocation profile of this process (the client side) here at the end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memprofile != "" {
		defer func() {
			f, err := os.Create(*memprofile)
			if err != nil {
				fmt.Fprintln(os.Stderr, "memprofile:", err)
				return
			}
			defer f.Close()
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintln(os.Stderr, "memprofile:", err)
			}
		}()
	}
	o.layouts, o.modes = splitList(layouts), splitList(modes)
	maxCallers := 1
	for _, c := range splitList(callers) {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fmt.Errorf("bad -callers %q", callers)
		}
		o.callers = append(o.callers, n)
		maxCallers = max(maxCallers, n)
	}
	for _, p := range splitList(procs) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return fmt.Errorf("bad -procs %q", procs)
		}
		o.procs = append(o.procs, n)
	}
	if len(o.procs) == 0 {
		o.procs = []int{0}
	}
	pcfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(maxCallers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var ver, sc string
	if err := pool.QueryRow(ctx, "SELECT version(), current_setting('synchronous_commit')").Scan(&ver, &sc); err != nil {
		return err
	}
	if sc != "on" {
		return fmt.Errorf("synchronous_commit is %q; this benchmark measures durable commits", sc)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "pgbench_idem_" + hex.EncodeToString(b[:])
	fmt.Fprintf(out, "# pgbench-idem %s\n# %s\n# synchronous_commit=%s rows=%d duration=%s batch=%d callers=%v schema=%s\n# client: NumCPU=%d GOMAXPROCS=%d (env %q) -procs %v\n\n",
		time.Now().UTC().Format(time.RFC3339), ver, sc, o.rows, o.duration, o.batch, o.callers, schema,
		runtime.NumCPU(), runtime.GOMAXPROCS(0), os.Getenv("GOMAXPROCS"), o.procs)
	if !o.keep {
		defer dropSchema(pool, schema)
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	fmt.Fprintln(out, "| layout | mode | callers | claims/s | p50 ms | p99 ms | vs raw, same callers (batch: multi-row; Claim: one-row) |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|")
	for _, ln := range o.layouts {
		l, err := pgstore.ParseLayout(ln)
		if err != nil {
			return err
		}
		// One schema per layout, dropped as soon as it is measured, so the
		// disk holds one filled layout at a time.
		ls := schema + "_" + l.String()
		err = benchLayout(ctx, pool, ls, l, o, out)
		if !o.keep {
			dropSchema(pool, ls)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", ln, err)
		}
	}
	if slices.Contains(o.modes, "seed") {
		if err := benchSeed(ctx, pool, schema, o, out); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	return nil
}

func dropSchema(pool *pgxpool.Pool, schema string) {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := pool.Exec(c, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		fmt.Fprintln(os.Stderr, "drop schema:", err)
	}
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

// result of one cell.
type result struct {
	claims int64
	secs   float64
	cpu    time.Duration   // this process's user+system CPU while measuring
	lat    []time.Duration // per call (a whole batch for batch/raw)
}

// cpuTime is this process's user+system CPU so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r result) rate() float64 { return float64(r.claims) / r.secs }

func (r result) pct(p float64) float64 {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	i := int(p * float64(len(r.lat)-1))
	return float64(r.lat[i].Microseconds()) / 1000
}

// measure runs callers goroutines calling op for d; op returns the number of
// claims it made.
func measure(ctx context.Context, callers int, d time.Duration, op func(ctx context.Context, caller int, seq *int64) (int, error)) (result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var total atomic.Int64
	var wg sync.WaitGroup
	lats := make([][]time.Duration, callers)
	errs := make([]error, callers)
	cpu0 := cpuTime()
	start := time.Now()
	deadline := start.Add(d)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var seq int64
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				n, err := op(ctx, c, &seq)
				if err != nil {
					errs[c] = err
					cancel()
					return
				}
				lats[c] = append(lats[c], time.Since(t0))
				total.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	r := result{claims: total.Load(), secs: time.Since(start).Seconds(), cpu: cpuTime() - cpu0}
	for _, l := range lats {
		r.lat = append(r.lat, l...)
	}
	for _, err := range errs {
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// keyGen makes fresh keys of the layout's distribution: random-looking
// text keys, or UUIDv7 keys of the current time for timed layouts.
func keyGen(timed bool, run string) func(caller int, seq *int64) []byte {
	return func(caller int, seq *int64) []byte {
		*seq++
		if !timed {
			return fmt.Appendf(nil, "msg-%s-%d-%d", run, caller, *seq)
		}
		var b [16]byte
		_, _ = rand.Read(b[6:])
		ms := time.Now().UnixMilli()
		for i := 0; i < 6; i++ {
			b[i] = byte(ms >> (40 - 8*i))
		}
		b[6] = 0x70 | b[6]&0x0f
		b[8] = 0x80 | b[8]&0x3f
		return b[:]
	}
}

func benchLayout(ctx context.Context, pool *pgxpool.Pool, schema string, l pgstore.Layout, o opts, out io.Writer) error {
	cfg := pgstore.Config{Pool: pool, Schema: schema, Table: "idem_" + l.String(), Namespace: "bench", Layout: l,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	switch l {
	case pgstore.LayoutSharded:
		cfg.Shards = o.shards
	case pgstore.LayoutTimeOrdered, pgstore.LayoutTimePartitioned:
		cfg.KeyTime = pgstore.UUIDv7KeyTime
	}
	if err := pgstore.Migrate(ctx, cfg); err != nil {
		return err
	}
	store, err := pgstore.New(cfg)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := fill(ctx, pool, cfg, o.rows); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	fmt.Fprintf(os.Stderr, "%s: filled %d rows in %s\n", l, o.rows, time.Since(t0).Round(time.Second))
	timed := l == pgstore.LayoutTimeOrdered || l == pgstore.LayoutTimePartitioned
	runID := hex.EncodeToString(func() []byte { var b [3]byte; _, _ = rand.Read(b[:]); return b[:] }())
	raw := rawInserter(cfg, timed, "")
	rawVariants := map[string]func(context.Context, *pgxpool.Pool, [][]byte) error{
		"rawret": rawInserter(cfg, timed, "rawret"), "fastsql": rawInserter(cfg, timed, "fastsql"),
	}
	var modes []string
	for _, m := range []string{"raw", "batch", "raw1", "single", "rawret", "fastsql"} {
		if slices.Contains(o.modes, m) {
			modes = append(modes, m)
		}
	}
	for _, callers := range o.callers {
		// The modes take turns in short rounds, so drift (table growth,
		// checkpoints, other load on the machine) hits them alike.
		// With several -procs, each round runs every mode under each
		// GOMAXPROCS setting in turn, so the settings are compared side by
		// side like the modes.
		type cell struct {
			procs int
			mode  string
		}
		res := map[cell]*result{}
		initProcs := runtime.GOMAXPROCS(0)
		for round := 0; round < o.rounds; round++ {
			for _, p := range o.procs {
				runtime.GOMAXPROCS(cmp.Or(p, initProcs))
				for _, mode := range modes {
					keys := keyGen(timed, fmt.Sprintf("%s-%s-%d-%d-p%d", runID, mode, callers, round, p)) // fresh keys per cell
					rw := raw
					if v := rawVariants[mode]; v != nil {
						rw = v
					}
					op := benchOp(mode, store, pool, rw, keys, o.batch)
					r, err := measure(ctx, callers, o.duration/time.Duration(o.rounds), op)
					if err != nil {
						return fmt.Errorf("%s x%d: %w", mode, callers, err)
					}
					c := cell{p, mode}
					if res[c] == nil {
						res[c] = &result{}
					}
					res[c].claims += r.claims
					res[c].secs += r.secs
					res[c].cpu += r.cpu
					res[c].lat = append(res[c].lat, r.lat...)
				}
			}
		}
		for _, p := range o.procs {
			for _, mode := range modes {
				r := res[cell{p, mode}]
				ratio := "-"
				base := res[cell{p, "raw"}]
				if mode == "single" || mode == "raw1" {
					base = res[cell{p, "raw1"}] // a single claim beside a single-row insert
				}
				if rr := base; rr != nil && mode != "raw" && mode != "raw1" {
					ratio = fmt.Sprintf("%.0f%%", 100*r.rate()/rr.rate())
				}
				name := modeName(mode, o.batch)
				if len(o.procs) > 1 || p > 0 {
					name += fmt.Sprintf(" [GOMAXPROCS=%d]", p)
				}
				fmt.Fprintf(out, "| %s | %s | %d | %.0f | %.2f | %.2f | %s |\n", l, name, callers, r.rate(), r.pct(0.50), r.pct(0.99), ratio)
				fmt.Fprintf(os.Stderr, "client cpu: %s %s x%d procs=%d: %.2f µs/claim, %.0f%% of one core\n", l, mode, callers, p,
					float64(r.cpu.Microseconds())/float64(max(r.claims, 1)), 100*r.cpu.Seconds()/r.secs)
			}
		}
		runtime.GOMAXPROCS(initProcs)
	}
	var size string
	if err := pool.QueryRow(ctx, `SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname LIKE $2 AND c.relkind IN ('r', 'p')`, schema, cfg.Table+"%").Scan(&size); err == nil {
		fmt.Fprintf(os.Stderr, "%s: tables and indexes now %s\n", l, size)
	}
	return nil
}

func benchOp(mode string, store *pgstore.Store, pool *pgxpool.Pool, raw func(context.Context, *pgxpool.Pool, [][]byte) error,
	keys func(int, *int64) []byte, batch int) func(ctx context.Context, caller int, seq *int64) (int, error) {
	lease, ttl := 30*time.Second, 7*24*time.Hour
	switch mode {
	case "single":
		return func(ctx context.Context, caller int, seq *int64) (int, error) {
			c, err := store.Claim(ctx, idem.ClaimRequest{Key: keys(caller, seq), Lease: lease, TTL: ttl})
			if err == nil && c.Outcome != idem.OutcomeAcquired {
				err = fmt.Errorf("fresh key not acquired: %s", c.Outcome)
			}
			return 1, err
		}
	case "batch":
		return func(ctx context.Context, caller int, seq *int64) (int, error) {
			reqs := make([]idem.ClaimRequest, batch)
			for i := range reqs {
				reqs[i] = idem.ClaimRequest{Key: keys(caller, seq), Lease: lease, TTL: ttl}
			}
			res, err := store.ClaimBatch(ctx, reqs)
			if err != nil {
				return 0, err
			}
			for _, r := range res {
				if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
					return 0, fmt.Errorf("fresh key not acquired: %v %v", r.Claim.Outcome, r.Err)
				}
			}
			return len(res), nil
		}
	}
	if mode == "raw1" {
		return func(ctx context.Context, caller int, seq *int64) (int, error) {
			return 1, raw(ctx, pool, [][]byte{keys(caller, seq)})
		}
	}
	return func(ctx context.Context, caller int, seq *int64) (int, error) {
		ks := make([][]byte, batch)
		for i := range ks {
			ks[i] = keys(caller, seq)
		}
		return len(ks), raw(ctx, pool, ks)
	}
}

func modeName(mode string, batch int) string {
	switch mode {
	case "batch":
		return fmt.Sprintf("ClaimBatch(%d)", batch)
	case "raw":
		return fmt.Sprintf("raw INSERT ON CONFLICT DO NOTHING (%d rows)", batch)
	case "raw1":
		return "raw INSERT ON CONFLICT DO NOTHING (1 row)"
	case "rawret":
		return fmt.Sprintf("raw ... RETURNING token, created_at (%d rows)", batch)
	case "fastsql":
		return fmt.Sprintf("ClaimBatch's fast statement alone (%d rows)", batch)
	}
	return "Claim"
}

// rawInserter returns the baseline: the same columns into the same table(s),
// one multi-row INSERT ... ON CONFLICT DO NOTHING per table touched, no
// outcome read back, no sequence. The fingerprint column gets its DEFAULT
// ”, which is what ClaimBatch stores for these requests (none has one).
//
// Two variants split the gap to ClaimBatch (-modes rawret,fastsql):
// "rawret" is the baseline plus RETURNING token, created_at; "fastsql" is
// ClaimBatch's fast-path statement for uniform lease/TTL (a copy of
// store.go's fastU: one nextval per statement, tokens v*1024+i, times from
// statement_timestamp()) sent the same way as the baseline, rows discarded:
// ClaimBatch minus its client-side work.
func rawInserter(cfg pgstore.Config, timed bool, variant string) func(ctx context.Context, pool *pgxpool.Pool, keys [][]byte) error {
	tables := []string{cfg.Table}
	if cfg.Layout == pgstore.LayoutSharded {
		tables = tables[:0]
		for i := 0; i < cfg.Shards; i++ {
			tables = append(tables, fmt.Sprintf("%s_s%03d", cfg.Table, i))
		}
	}
	sqls := make([]string, len(tables))
	for i, t := range tables {
		kt, ktv, un := "", "", "unnest($1::bytea[], $2::bytea[]) AS q(h, k)"
		if timed {
			kt, ktv, un = "key_time, ", "q.t, ", "unnest($1::bytea[], $2::bytea[], $3::timestamptz[]) AS q(h, k, t)"
		}
		sqls[i] = `INSERT INTO ` + cfg.Schema + `.` + t + ` (ns, key_hash, ` + kt + `token, lease_until, expires_at, created_at, updated_at, ttl_us, attempts, state, key)
SELECT 'bench', q.h, ` + ktv + `0, now() + interval '30 s', now() + interval '7 days', now(), now(), 604800000000, 1, 1, q.k FROM ` + un + `
ON CONFLICT DO NOTHING`
		switch variant {
		case "rawret":
			sqls[i] += " RETURNING token, created_at"
		case "fastsql":
			un = "unnest($1::bytea[], $2::bytea[], $3::bytea[]) WITH ORDINALITY AS q(h, k, fp, i)"
			if timed {
				un = "unnest($1::bytea[], $2::bytea[], $4::bytea[], $3::timestamptz[]) WITH ORDINALITY AS q(h, k, fp, t, i)"
			}
			l, ttl := "$4::bigint", "$5::bigint"
			if timed {
				l, ttl = "$5::bigint", "$6::bigint"
			}
			sqls[i] = `INSERT INTO ` + cfg.Schema + `.` + t + ` AS r (ns, key_hash, ` + kt + `key, state, token, fingerprint, attempts, lease_until, expires_at, created_at, updated_at, ttl_us)
SELECT 'bench', q.h, ` + ktv + `q.k, 1, (SELECT nextval('` + cfg.Schema + `.` + cfg.Table + `_token_seq')) * 1024 + q.i - 1, coalesce(q.fp, ''), 1,
	statement_timestamp() + ` + l + ` * interval '1 microsecond', statement_timestamp() + greatest(` + l + `, ` + ttl + `) * interval '1 microsecond',
	statement_timestamp(), statement_timestamp(), ` + ttl + ` FROM ` + un + `
ON CONFLICT DO NOTHING RETURNING r.token, r.created_at`
		}
	}
	return func(ctx context.Context, pool *pgxpool.Pool, keys [][]byte) error {
		type grp struct {
			h, k [][]byte
			t    []time.Time
		}
		groups := make([]grp, len(tables))
		for _, k := range keys {
			sum := sha256.Sum256(k)
			ti := 0
			if len(tables) > 1 {
				ti = int(binary.BigEndian.Uint32(sum[16:]) % uint32(len(tables)))
			}
			g := &groups[ti]
			g.h, g.k = append(g.h, sum[:16]), append(g.k, k)
			if timed {
				kt, err := pgstore.UUIDv7KeyTime(k)
				if err != nil {
					return err
				}
				g.t = append(g.t, kt)
			}
		}
		b := &pgx.Batch{}
		for i, g := range groups {
			if len(g.h) == 0 {
				continue
			}
			args := []any{g.h, g.k}
			if timed {
				args = append(args, g.t)
			}
			if variant == "fastsql" {
				args = append(args, [][]byte(nil), int64(30_000_000), int64(604800000000))
			}
			b.Queue(sqls[i], args...)
		}
		return pool.SendBatch(ctx, b).Close()
	}
}

// fill bulk-loads rows completed records with generate_series. Indexes are
// dropped first and rebuilt after (sorted builds), then the table is
// vacuumed and a checkpoint taken, so the measurement starts from a
// realistic steady state instead of a fill's dirty buffers.
func fill(ctx context.Context, pool *pgxpool.Pool, cfg pgstore.Config, rows int64) error {
	tables := []string{cfg.Table}
	if cfg.Layout == pgstore.LayoutSharded {
		tables = tables[:0]
		for i := 0; i < cfg.Shards; i++ {
			tables = append(tables, fmt.Sprintf("%s_s%03d", cfg.Table, i))
		}
	}
	timed := cfg.Layout == pgstore.LayoutTimeOrdered || cfg.Layout == pgstore.LayoutTimePartitioned
	pk := "ns, key_hash"
	if timed {
		pk = "ns, key_time, key_hash"
	}
	exec := func(sql string, args ...any) error {
		_, err := pool.Exec(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(sql, "\n", 2)[0], err)
		}
		return nil
	}
	// Background keys are spread over the last two days (timed layouts:
	// UUIDv7 keys of those times, in their partitions); the benchmark's own
	// keys are new and of "now".
	now := time.Now()
	spanMS := int64(2 * 24 * time.Hour / time.Millisecond)
	baseMS := now.Add(-2*24*time.Hour).UnixMilli() - 1000
	if cfg.Layout == pgstore.LayoutTimePartitioned {
		s, err := pgstore.New(cfg)
		if err != nil {
			return err
		}
		for d := -3; d <= 0; d++ { // partitions for the background keys
			if _, err := s.Claim(ctx, idem.ClaimRequest{Key: uuid7(now.Add(time.Duration(d) * 24 * time.Hour)), Lease: time.Millisecond, TTL: time.Millisecond}); err != nil {
				return err
			}
		}
	}
	per := rows / int64(len(tables))
	for ti, t := range tables {
		T := cfg.Schema + "." + t
		if err := exec("ALTER TABLE " + T + " DROP CONSTRAINT IF EXISTS " + t + "_pkey"); err != nil {
			return err
		}
		if err := exec("DROP INDEX IF EXISTS " + cfg.Schema + "." + t + "_expires_idx"); err != nil {
			return err
		}
		lo, hi := int64(ti)*per+1, int64(ti+1)*per
		if ti == len(tables)-1 {
			hi = rows
		}
		kexpr, ktcol, ktval := "convert_to('fill-' || i, 'UTF8')", "", ""
		if timed {
			ms := fmt.Sprintf("(%d + i * %d / %d)", baseMS, spanMS, max(rows, 1))
			kexpr = "decode(lpad(to_hex(" + ms + "), 12, '0') || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15), 'hex')"
			ktcol, ktval = "key_time, ", "'epoch'::timestamptz + "+ms+" * interval '1 millisecond', "
		}
		// Fill in chunks so one statement never holds a huge transaction.
		const chunk = 1_000_000
		for a := lo; a <= hi; a += chunk {
			b := min(a+chunk-1, hi)
			if err := exec(`INSERT INTO `+T+` (ns, key_hash, `+ktcol+`token, lease_until, expires_at, created_at, updated_at, ttl_us, attempts, state, key, result)
SELECT 'bench', substring(sha256(x.k) for 16), `+ktval+`i, now() - interval '1 hour', now() + interval '7 days', now() - interval '1 hour', now(), 604800000000, 1, 2, x.k, '\x6f6b'::bytea
FROM generate_series($1::bigint, $2::bigint) AS i, LATERAL (SELECT `+kexpr+` AS k) AS x`, a, b); err != nil {
				return err
			}
		}
		if err := exec("ALTER TABLE " + T + " ADD CONSTRAINT " + t + "_pkey PRIMARY KEY (" + pk + ")"); err != nil {
			return err
		}
		if err := exec("CREATE INDEX " + t + "_expires_idx ON " + T + " (expires_at, ns)"); err != nil {
			return err
		}
	}
	if err := exec("SELECT setval('"+cfg.Schema+"."+cfg.Table+"_token_seq', $1)", rows+1); err != nil {
		return err
	}
	for _, t := range tables {
		if err := exec("VACUUM ANALYZE " + cfg.Schema + "." + t); err != nil {
			return err
		}
	}
	return exec("CHECKPOINT")
}

func uuid7(t time.Time) []byte {
	var b [16]byte
	_, _ = rand.Read(b[6:])
	ms := t.UnixMilli()
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	return b[:]
}

// benchSeed measures the seeds' approach on a table of the seeds' shape:
// per message SELECT COUNT(*) ... WHERE CONCAT(message_id, ':',
// business_key) = $1 (which no index can serve), then INSERT.
func benchSeed(ctx context.Context, pool *pgxpool.Pool, schema string, o opts, out io.Writer) error {
	T := schema + ".message_idempotent"
	for _, s := range []string{
		`CREATE TABLE ` + T + ` (id bigserial PRIMARY KEY, message_id varchar(64) NOT NULL, business_key varchar(128) NOT NULL,
	processed_at timestamptz NOT NULL, status int NOT NULL)`,
		`INSERT INTO ` + T + ` (message_id, business_key, processed_at, status)
	SELECT 'm-' || i, 'order-' || i, now(), 1 FROM generate_series(1, ` + strconv.FormatInt(o.rows, 10) + `) i`,
		`CREATE UNIQUE INDEX ON ` + T + ` (message_id)`,
		`CREATE UNIQUE INDEX ON ` + T + ` (business_key)`,
		`VACUUM ANALYZE ` + T,
		`CHECKPOINT`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return err
		}
	}
	run := hex.EncodeToString(func() []byte { var b [3]byte; _, _ = rand.Read(b[:]); return b[:] }())
	for _, callers := range o.callers {
		if callers > o.seedMax {
			continue
		}
		res, err := measure(ctx, callers, o.duration, func(ctx context.Context, caller int, seq *int64) (int, error) {
			*seq++
			mid, bk := fmt.Sprintf("s-%s-%d-%d", run, caller, *seq), fmt.Sprintf("order-%s-%d-%d", run, caller, *seq)
			var n int64
			if err := pool.QueryRow(ctx, "SELECT COUNT(*) FROM "+T+" WHERE CONCAT(message_id, ':', business_key) = $1", mid+":"+bk).Scan(&n); err != nil {
				return 0, err
			}
			if n == 0 {
				if _, err := pool.Exec(ctx, "INSERT INTO "+T+" (message_id, business_key, processed_at, status) VALUES ($1, $2, now(), 1)", mid, bk); err != nil {
					return 0, err
				}
			}
			return 1, nil
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "| seed table | COUNT(*) CONCAT then INSERT | %d | %.1f | %.2f | %.2f | - |\n", callers, res.rate(), res.pct(0.5), res.pct(0.99))
	}
	return nil
}
