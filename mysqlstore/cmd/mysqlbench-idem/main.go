// Command mysqlbench-idem measures mysqlstore claims on MariaDB against a
// table pre-filled to -rows records, beside two baselines run in the same
// process, on the same server and table size:
//
//   - raw: a plain INSERT IGNORE of the same rows into the same table (one
//     row per statement for "single", -batch rows per statement for
//     "batch"): what inserting costs with no idempotency logic at all;
//   - seeds: the seeds' approach, per message SELECT COUNT(*) FROM
//     message_idempotent WHERE CONCAT(message_id, ':', business_key) = ?
//     then INSERT, on their table filled to the same size.
//
// It creates a database of its own (idem_bench_<random>) and drops it at
// the end, also on Ctrl-C. Durability is whatever the server has; it prints
// innodb_flush_log_at_trx_commit (1 = durable at every commit).
//
//	go run ./cmd/mysqlbench-idem -rows 100000              # quick
//	go run ./cmd/mysqlbench-idem -rows 10000000 -layouts single,time_ordered
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
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

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mysqlbench-idem:", err)
		os.Exit(1)
	}
}

type opts struct {
	addr, user string
	rows       int
	layouts    []mysqlstore.Layout
	callers    []int
	batch      int
	dur        time.Duration
	seedDur    time.Duration
	seeds      bool
	keep       bool
	odku       bool
	repeat     int
	decompose  bool
	lock       locker
}

func run() error {
	var o opts
	flag.StringVar(&o.addr, "addr", "127.0.0.1:3306", "MariaDB address")
	flag.StringVar(&o.user, "user", "root", "MariaDB user (no password)")
	flag.IntVar(&o.rows, "rows", 100000, "rows to pre-fill in each table (10000000 for the full run)")
	layouts := flag.String("layouts", "single,sharded,time_ordered,time_partitioned", "layouts to measure")
	callers := flag.String("callers", "1,4,16,64", "concurrent callers")
	flag.IntVar(&o.batch, "batch", 100, "claims per batch call")
	flag.DurationVar(&o.dur, "duration", 5*time.Second, "measuring time per cell")
	flag.DurationVar(&o.seedDur, "seeds-duration", 10*time.Second, "measuring time per seeds cell (at least 2 calls)")
	flag.BoolVar(&o.seeds, "seeds", true, "measure the seeds' approach")
	flag.IntVar(&o.repeat, "repeat", 1, "rounds of every cell, interleaved; the report takes the median (the machine is shared: use 3)")
	flag.BoolVar(&o.keep, "keep", false, "keep the database (debugging)")
	flag.BoolVar(&o.odku, "single-statement", true, "also measure Config.SingleStatement (claim-1stmt, batch-1stmt)")
	flag.BoolVar(&o.decompose, "decompose", false, "instead of the cells: the claim statement built up feature by feature from the raw insert, with server and client CPU per statement (first layout only)")
	flag.StringVar(&o.lock.path, "lock", "", "hold an flock(2) on this file (e.g. /tmp/bench.lock) during each fill and each group of cells with the same callers, releasing it in between")
	flag.Parse()
	for _, s := range strings.Split(*layouts, ",") {
		l, err := mysqlstore.ParseLayout(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		o.layouts = append(o.layouts, l)
	}
	for _, s := range strings.Split(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 128 {
			return fmt.Errorf("bad -callers entry %q", s)
		}
		o.callers = append(o.callers, n)
	}
	if o.rows < 0 || o.batch < 1 || o.batch > 1000 || o.repeat < 1 {
		return fmt.Errorf("bad -rows or -batch")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return bench(ctx, o)
}

func dsn(o opts, db string) string {
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr, c.DBName = o.user, "tcp", o.addr, db
	return c.FormatDSN()
}

type result struct {
	layout, name string
	callers      int
	claims       int64
	calls        int64
	elapsed      time.Duration
	p50, p99     time.Duration
}

func (r result) rate() float64 { return float64(r.claims) / r.elapsed.Seconds() }

func bench(ctx context.Context, o opts) error {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "idem_bench_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("mysql", dsn(o, ""))
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return err
	}
	if !o.keep {
		defer func() {
			if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name); err != nil {
				fmt.Fprintln(os.Stderr, "drop:", err)
			}
		}()
	}
	db, err := sql.Open("mysql", dsn(o, name))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(140)
	db.SetMaxIdleConns(140)
	var version, flush, pool string
	_ = db.QueryRowContext(ctx, "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@innodb_buffer_pool_size").Scan(&version, &flush, &pool)
	fmt.Printf("# MariaDB %s, innodb_flush_log_at_trx_commit=%s, innodb_buffer_pool_size=%s, rows=%d, batch=%d, %s per cell\n\n",
		version, flush, pool, o.rows, o.batch, o.dur)

	if o.decompose {
		return decompose(ctx, o, db, o.layouts[0])
	}
	var results []result
	if o.seeds {
		rs, err := benchSeeds(ctx, o, db)
		if err != nil {
			return err
		}
		results = append(results, rs...)
	}
	for _, l := range o.layouts {
		rs, err := benchLayout(ctx, o, db, l)
		if err != nil {
			return err
		}
		results = append(results, rs...)
		if _, err := db.ExecContext(ctx, "DROP SEQUENCE IF EXISTS idem_records_token"); err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+shardTables(l)); err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, "DELETE FROM idem_schema_versions"); err != nil {
			return err
		}
	}
	report(os.Stdout, o, results)
	return nil
}

func shardTables(l mysqlstore.Layout) string {
	if l != mysqlstore.LayoutSharded {
		return "idem_records"
	}
	var t []string
	for i := 0; i < mysqlstore.DefaultShards; i++ {
		t = append(t, fmt.Sprintf("idem_records_%02d", i))
	}
	return strings.Join(t, ", ")
}

// measure runs fn from callers goroutines for d and collects per-call
// latencies. fn returns how many claims the call made.
func measure(ctx context.Context, callers int, d time.Duration, minCalls int64, fn func(ctx context.Context, w int) (int, error)) (result, error) {
	var claims, calls atomic.Int64
	lat := make([][]time.Duration, callers)
	errs := make([]error, callers)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		wg.Go(func() {
			for ctx.Err() == nil && (time.Now().Before(deadline) || calls.Load() < minCalls) {
				t0 := time.Now()
				n, err := fn(ctx, w)
				if err != nil {
					errs[w] = err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				claims.Add(int64(n))
				calls.Add(1)
			}
		})
	}
	wg.Wait()
	r := result{callers: callers, claims: claims.Load(), calls: calls.Load(), elapsed: time.Since(start)}
	if err := errors.Join(errs...); err != nil {
		return r, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		r.p50 = all[len(all)/2]
		r.p99 = all[min(len(all)-1, len(all)*99/100)]
	}
	return r, ctx.Err()
}

// keyGen makes new keys: random-looking names (random hash, random index
// position) or UUIDv7 text (time-ordered) for the timed layouts.
type keyGen struct {
	run  string
	seq  atomic.Uint64
	uuid bool
}

func (g *keyGen) next() []byte {
	n := g.seq.Add(1)
	if !g.uuid {
		return []byte(fmt.Sprintf("msg-%s-%d", g.run, n))
	}
	ms := time.Now().UnixMilli()
	var b [16]byte
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	_, _ = rand.Read(b[6:])
	b[6] = 0x70 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	h := hex.EncodeToString(b[:])
	return []byte(h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:])
}

func benchLayout(ctx context.Context, o opts, db *sql.DB, l mysqlstore.Layout) ([]result, error) {
	cfg := mysqlstore.Config{DB: db, Layout: l, Namespace: "bench", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if l == mysqlstore.LayoutTimeOrdered || l == mysqlstore.LayoutTimePartitioned {
		cfg.KeyTime = mysqlstore.UUIDv7KeyTime
	}
	if err := mysqlstore.Migrate(ctx, cfg); err != nil {
		return nil, err
	}
	t0 := time.Now()
	unlock := o.lock.hold("fill " + l.String())
	err := fill(ctx, db, l, o.rows)
	unlock()
	if err != nil {
		return nil, fmt.Errorf("fill %s: %w", l, err)
	}
	fmt.Fprintf(os.Stderr, "%s: filled %d rows in %s\n", l, o.rows, time.Since(t0).Round(time.Second))
	s, err := mysqlstore.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	cfg1 := cfg
	cfg1.SingleStatement = true
	s1, err := mysqlstore.Open(ctx, cfg1)
	if err != nil {
		return nil, err
	}
	defer s1.Close()
	g := &keyGen{run: hex.EncodeToString([]byte(time.Now().Format("150405.000"))), uuid: cfg.KeyTime != nil}
	req := func() idem.ClaimRequest {
		return idem.ClaimRequest{Key: g.next(), Lease: time.Minute, TTL: 7 * 24 * time.Hour}
	}
	timed := cfg.KeyTime != nil
	var out []result
	add := func(name string, callers int, fn func(ctx context.Context, w int) (int, error)) error {
		r, err := measure(ctx, callers, o.dur, 1, fn)
		if err != nil {
			return fmt.Errorf("%s %s x%d: %w", l, name, callers, err)
		}
		r.layout, r.name = l.String(), name
		fmt.Fprintf(os.Stderr, "  %-14s x%-3d %9.0f claims/s p50 %v p99 %v\n", name, callers, r.rate(), r.p50, r.p99)
		out = append(out, r)
		return nil
	}
	for rep := 0; rep < o.repeat; rep++ {
		for _, c := range o.callers {
			if err := func() error {
				defer o.lock.hold(fmt.Sprintf("%s x%d round %d", l, c, rep+1))()
				if err := add("claim", c, func(ctx context.Context, _ int) (int, error) {
					cl, err := s.Claim(ctx, req())
					if err == nil && cl.Outcome != idem.OutcomeAcquired {
						err = fmt.Errorf("new key not acquired: %s", cl.Outcome)
					}
					return 1, err
				}); err != nil {
					return err
				}
				if err := add("raw-insert", c, func(ctx context.Context, _ int) (int, error) {
					return 1, rawInsert(ctx, db, l, timed, false, [][]byte{g.next()})
				}); err != nil {
					return err
				}
				if err := add("raw-odku", c, func(ctx context.Context, _ int) (int, error) {
					return 1, rawInsert(ctx, db, l, timed, true, [][]byte{g.next()})
				}); err != nil {
					return err
				}
				batch := func(st *mysqlstore.Store) func(ctx context.Context, _ int) (int, error) {
					return func(ctx context.Context, _ int) (int, error) {
						reqs := make([]idem.ClaimRequest, o.batch)
						for i := range reqs {
							reqs[i] = req()
						}
						res, err := st.ClaimBatch(ctx, reqs)
						for _, r := range res {
							if err == nil && (r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired) {
								err = fmt.Errorf("batch entry: %+v", r)
							}
						}
						return len(reqs), err
					}
				}
				if err := add("batch", c, batch(s)); err != nil {
					return err
				}
				if o.odku {
					if err := add("claim-1stmt", c, func(ctx context.Context, _ int) (int, error) {
						cl, err := s1.Claim(ctx, req())
						if err == nil && cl.Outcome != idem.OutcomeAcquired {
							err = fmt.Errorf("new key not acquired: %s", cl.Outcome)
						}
						return 1, err
					}); err != nil {
						return err
					}
					if err := add("batch-1stmt", c, batch(s1)); err != nil {
						return err
					}
				}
				if err := add("raw-batch", c, func(ctx context.Context, _ int) (int, error) {
					keys := make([][]byte, o.batch)
					for i := range keys {
						keys[i] = g.next()
					}
					return len(keys), rawInsert(ctx, db, l, timed, false, keys)
				}); err != nil {
					return err
				}
				if err := add("raw-odku-batch", c, func(ctx context.Context, _ int) (int, error) {
					keys := make([][]byte, o.batch)
					for i := range keys {
						keys[i] = g.next()
					}
					return len(keys), rawInsert(ctx, db, l, timed, true, keys)
				}); err != nil {
					return err
				}
				return nil
			}(); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// rawInsert is the baseline: INSERT IGNORE of the same columns, values
// computed in Go, no sequence, no RETURNING, no takeover logic. With odku
// it is INSERT ... ON DUPLICATE KEY UPDATE k = k (a no-op update) instead.
func rawInsert(ctx context.Context, db *sql.DB, l mysqlstore.Layout, timed, odku bool, keys [][]byte) error {
	now := time.Now().UnixMicro()
	byTable := map[string][]string{}
	for _, k := range keys {
		h := keyHash(k)
		tbl := "idem_records"
		if l == mysqlstore.LayoutSharded {
			tbl = fmt.Sprintf("idem_records_%02d", (uint32(h[0])<<24|uint32(h[1])<<16|uint32(h[2])<<8|uint32(h[3]))%mysqlstore.DefaultShards)
		}
		var sb strings.Builder
		sb.WriteString("('bench',")
		if timed {
			kt, _ := mysqlstore.UUIDv7KeyTime(k)
			sb.WriteString(strconv.FormatInt(kt.UnixMicro(), 10) + ",")
		}
		fmt.Fprintf(&sb, "X'%x',X'%x',1,1,1,'',NULL,1,'',604800000000,%d,%d,%d,%d)", h, k, now+60e6, now+604800e6, now, now)
		byTable[tbl] = append(byTable[tbl], sb.String())
	}
	cols := "ns, key_hash, k, state, token, nonce, fp, result, attempts, last_error, ttl_us, lease_until, expires_at, created_at, updated_at"
	if timed {
		cols = "ns, key_time, " + cols[4:]
	}
	for tbl, vals := range byTable {
		q := "INSERT IGNORE INTO " + tbl + " (" + cols + ") VALUES " + strings.Join(vals, ",")
		if odku {
			q = "INSERT INTO " + tbl + " (" + cols + ") VALUES " + strings.Join(vals, ",") + " ON DUPLICATE KEY UPDATE k = k"
		}
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// fill bulk-loads rows completed records with INSERT ... SELECT from the
// sequence engine (seq_1_to_N), in primary-key order so InnoDB appends
// instead of splitting pages (a fill in random hash order slows to minutes
// per million rows once the index outgrows the buffer pool).
//
// The filled key_hash is not SHA-256 of the filled key: it is seq*step in
// its first 8 bytes (step = 2^64/(rows+1)) and seq in the last 8, i.e. the
// rows are spread evenly over the whole hash space, as random hashes are,
// but generated in order. The index then has the same shape and the same
// page-touch pattern for new random keys as a table filled by real claims.
// Filled keys are never claimed again. Timed layouts get key times spread
// in order over the 3 days before now; the new keys come after them.
func fill(ctx context.Context, db *sql.DB, l mysqlstore.Layout, rows int) error {
	if rows == 0 {
		return nil
	}
	var now int64
	if err := db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND,'1970-01-01 00:00:00',UTC_TIMESTAMP(6))").Scan(&now); err != nil {
		return err
	}
	const chunk = 1000000
	step := uint64(1<<63) / uint64(rows+1) * 2
	hashExpr := fmt.Sprintf("UNHEX(CONCAT(LPAD(HEX(CAST(seq AS UNSIGNED) * %d), 16, '0'), LPAD(HEX(seq), 16, '0')))", step)
	tables := []string{"idem_records"}
	if l == mysqlstore.LayoutSharded {
		tables = strings.Split(shardTables(l), ", ")
	}
	timed := l == mysqlstore.LayoutTimeOrdered || l == mysqlstore.LayoutTimePartitioned
	for ti, tbl := range tables {
		for lo := 1; lo <= rows; lo += chunk {
			hi := min(rows, lo+chunk-1)
			kt, cols := "", "ns, key_hash, k"
			if timed {
				kt = fmt.Sprintf("%d + seq * %d, ", now-3*86400e6, int64(3*86400e6)/int64(rows+1))
				cols = "ns, key_time, key_hash, k"
			}
			where := ""
			if len(tables) > 1 {
				// The store routes by BigEndian(hash[0:4]) % shards.
				where = fmt.Sprintf(" WHERE ((CAST(seq AS UNSIGNED) * %d) >> 32) %% %d = %d", step, len(tables), ti)
			}
			q := fmt.Sprintf(`INSERT INTO %s (%s, state, token, nonce, fp, result, attempts, last_error, ttl_us, lease_until, expires_at, created_at, updated_at)
SELECT 'bench', %s%s, CONCAT('fill-', seq), 2, 1, 1, '', NULL, 1, '', 604800000000, %d, %d, %d, %d FROM seq_%d_to_%d%s`,
				tbl, cols, kt, hashExpr, now, now+604800e6, now, now, lo, hi, where)
			if _, err := db.ExecContext(ctx, q); err != nil {
				return err
			}
		}
	}
	return nil
}

// benchSeeds measures the seeds' check-then-insert with CONCAT in the WHERE
// clause, on their table (two utf8mb4 unique keys) filled to rows.
func benchSeeds(ctx context.Context, o opts, db *sql.DB) ([]result, error) {
	if _, err := db.ExecContext(ctx, "CREATE TABLE message_idempotent (\n"+
		"  id bigint(20) NOT NULL AUTO_INCREMENT,\n  message_id varchar(64) NOT NULL,\n  business_key varchar(128) NOT NULL,\n"+
		"  processed_at datetime NOT NULL,\n  status int(11) NOT NULL,\n  PRIMARY KEY (id),\n"+
		"  UNIQUE KEY uk_message_id (message_id),\n  UNIQUE KEY uk_business_key (business_key)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"); err != nil {
		return nil, err
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS message_idempotent")
	t0 := time.Now()
	unlock := o.lock.hold("fill seeds")
	defer func() { unlock() }()
	for lo := 1; lo <= o.rows; lo += 1000000 {
		hi := min(o.rows, lo+1000000-1)
		if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO message_idempotent (message_id, business_key, processed_at, status) "+
			"SELECT CONCAT('m-', LPAD(seq, 10, '0')), CONCAT('b-', LPAD(seq, 10, '0')), NOW(), 1 FROM seq_%d_to_%d", lo, hi)); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(os.Stderr, "seeds: filled %d rows in %s\n", o.rows, time.Since(t0).Round(time.Second))
	unlock()
	unlock = func() {}
	var seq atomic.Uint64
	var out []result
	for _, c := range []int{1, 4} {
		if !slices.Contains(o.callers, c) {
			continue
		}
		unlock = o.lock.hold(fmt.Sprintf("seeds x%d", c))
		r, err := measure(ctx, c, o.seedDur, 2, func(ctx context.Context, _ int) (int, error) {
			n := seq.Add(1)
			mid, bk := fmt.Sprintf("s-%d", n), fmt.Sprintf("sk-%d", n)
			var cnt int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM message_idempotent WHERE CONCAT(message_id, ':', business_key) = ?", mid+":"+bk).Scan(&cnt); err != nil {
				return 0, err
			}
			if cnt > 0 {
				return 1, nil
			}
			_, err := db.ExecContext(ctx, "INSERT INTO message_idempotent (message_id, business_key, processed_at, status) VALUES (?, ?, NOW(), 1)", mid, bk)
			return 1, err
		})
		if err != nil {
			return out, err
		}
		unlock()
		unlock = func() {}
		r.layout, r.name = "seeds", "seeds"
		fmt.Fprintf(os.Stderr, "  %-14s x%-3d %9.1f claims/s p50 %v p99 %v\n", "seeds", c, r.rate(), r.p50, r.p99)
		out = append(out, r)
	}
	return out, nil
}

// median merges repeated cells: the median rate (by claims/s) and the
// median of the rounds' p50 and p99.
func median(rs []result) []result {
	type key struct {
		layout, name string
		callers      int
	}
	groups := map[key][]result{}
	var order []key
	for _, r := range rs {
		k := key{r.layout, r.name, r.callers}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []result
	for _, k := range order {
		g := groups[k]
		slices.SortFunc(g, func(a, b result) int { return cmp.Compare(a.rate(), b.rate()) })
		m := g[len(g)/2]
		p50s, p99s := make([]time.Duration, len(g)), make([]time.Duration, len(g))
		for i, r := range g {
			p50s[i], p99s[i] = r.p50, r.p99
		}
		slices.Sort(p50s)
		slices.Sort(p99s)
		m.p50, m.p99 = p50s[len(g)/2], p99s[len(g)/2]
		out = append(out, m)
	}
	return out
}

func report(w io.Writer, o opts, rs []result) {
	rs = median(rs)
	find := func(layout, name string, callers int) *result {
		for i := range rs {
			if rs[i].layout == layout && rs[i].name == name && rs[i].callers == callers {
				return &rs[i]
			}
		}
		return nil
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }
	fmt.Fprintln(w, "| layout | mode | callers | claims/s | p50 ms/call | p99 ms/call | vs raw insert | vs raw ODKU | vs seeds x1 |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	seed1 := find("seeds", "seeds", 1)
	for _, r := range rs {
		vsRaw, vsSeed := "", ""
		rawName := map[string]string{"claim": "raw-insert", "batch": "raw-batch", "claim-1stmt": "raw-insert", "batch-1stmt": "raw-batch"}[r.name]
		if raw := find(r.layout, rawName, r.callers); raw != nil && rawName != "" {
			vsRaw = fmt.Sprintf("%.2f", r.rate()/raw.rate())
		}
		vsODKU := ""
		odkuName := map[string]string{"claim": "raw-odku", "batch": "raw-odku-batch", "claim-1stmt": "raw-odku", "batch-1stmt": "raw-odku-batch"}[r.name]
		if raw := find(r.layout, odkuName, r.callers); raw != nil && odkuName != "" {
			vsODKU = fmt.Sprintf("%.2f", r.rate()/raw.rate())
		}
		if seed1 != nil && r.layout != "seeds" && seed1.rate() > 0 {
			vsSeed = fmt.Sprintf("%.0fx", r.rate()/seed1.rate())
		}
		rate := fmt.Sprintf("%.0f", r.rate())
		if r.rate() < 10 {
			rate = fmt.Sprintf("%.2f", r.rate())
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", r.layout, r.name, r.callers, rate, ms(r.p50), ms(r.p99), vsRaw, vsODKU, vsSeed)
	}
}

// locker serialises CPU use with other benchmarks on a shared machine: an
// exclusive flock(2) on path (the file flock(1) uses) around each fill and
// cell group, released in between so nobody waits for a whole run.
type locker struct{ path string }

func (lk locker) hold(what string) (unlock func()) {
	if lk.path == "" {
		return func() {}
	}
	f, err := os.OpenFile(lk.path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lock:", err)
		return func() {}
	}
	t0 := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		fmt.Fprintln(os.Stderr, "lock:", err)
	}
	la, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(os.Stderr, "# %s %s: lock after %s, loadavg %s", time.Now().UTC().Format("15:04:05"), what, time.Since(t0).Round(time.Millisecond), la)
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}
