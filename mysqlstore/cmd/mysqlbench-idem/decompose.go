package main

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// decompose measures, on one filled table, the claim statement built up one
// feature at a time from the raw INSERT IGNORE baseline, so the gap between
// ClaimBatch and a raw multi-row insert can be attributed. Besides calls/s
// it reports the server's CPU (mariadbd utime+stime from /proc) and this
// process's CPU per statement.
func decompose(ctx context.Context, o opts, db *sql.DB, l mysqlstore.Layout) error {
	cfg := mysqlstore.Config{DB: db, Layout: l, Namespace: "bench", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	timed := l == mysqlstore.LayoutTimeOrdered || l == mysqlstore.LayoutTimePartitioned
	if timed {
		cfg.KeyTime = mysqlstore.UUIDv7KeyTime
	}
	if err := mysqlstore.Migrate(ctx, cfg); err != nil {
		return err
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS idem_records")
	defer db.ExecContext(context.Background(), "DROP SEQUENCE IF EXISTS idem_records_token")
	defer db.ExecContext(context.Background(), "DELETE FROM idem_schema_versions")
	t0 := time.Now()
	unlock := o.lock.hold("fill " + l.String())
	err := fill(ctx, db, l, o.rows)
	unlock()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s: filled %d rows in %s\n", l, o.rows, time.Since(t0).Round(time.Second))
	s, err := mysqlstore.Open(ctx, cfg)
	if err != nil {
		return err
	}
	g := &keyGen{run: hex.EncodeToString([]byte(time.Now().Format("150405.000"))), uuid: timed}
	pid := serverPID()
	const nowUS = "TIMESTAMPDIFF(MICROSECOND,'1970-01-01 00:00:00',UTC_TIMESTAMP(6))"
	const recCols = "k, state, token, nonce, fp, result, attempts, last_error, lease_until, expires_at, created_at, updated_at"
	type feat struct{ seq, now, ret, odku, hexns, derived bool }
	build := func(f feat, keys [][]byte) string {
		now := time.Now().UnixMicro()
		if f.derived {
			// The store's form for 16+ rows: INSERT ... SELECT from a CTE.
			var sb strings.Builder
			sb.WriteString("INSERT IGNORE INTO idem_records (ns, ")
			if timed {
				sb.WriteString("key_time, ")
			}
			sb.WriteString("key_hash, k, state, token, nonce, fp, result, attempts, last_error, ttl_us, lease_until, expires_at, created_at, updated_at) WITH idem_v (")
			if timed {
				sb.WriteString("v_kt, ")
			}
			sb.WriteString("v_hash, v_k, v_nonce, v_fp, v_ttl, v_lease, v_life) AS (VALUES ")
			for i, k := range keys {
				if i > 0 {
					sb.WriteByte(',')
				}
				sb.WriteByte('(')
				if timed {
					kt, _ := mysqlstore.UUIDv7KeyTime(k)
					sb.WriteString(strconv.FormatInt(kt.UnixMicro(), 10) + ",")
				}
				fmt.Fprintf(&sb, "X'%x',X'%x',12345,X'',604800000000,60000000,604800000000)", keyHash(k), k)
			}
			sb.WriteString(") SELECT X'62656e6368'")
			if timed {
				sb.WriteString(", v_kt")
			}
			sb.WriteString(", v_hash, v_k, 1, NEXTVAL(idem_records_token), v_nonce, v_fp, NULL, 1, '', v_ttl, idem_now.t + v_lease, idem_now.t + v_life, idem_now.t, idem_now.t FROM idem_v JOIN (SELECT " + nowUS + " AS t) idem_now ON TRUE RETURNING " + recCols)
			return sb.String()
		}
		var sb strings.Builder
		if f.odku {
			sb.WriteString("INSERT INTO idem_records (")
		} else {
			sb.WriteString("INSERT IGNORE INTO idem_records (")
		}
		if timed {
			sb.WriteString("ns, key_time, ")
		} else {
			sb.WriteString("ns, ")
		}
		sb.WriteString("key_hash, k, state, token, nonce, fp, result, attempts, last_error, ttl_us, lease_until, expires_at, created_at, updated_at) VALUES ")
		for i, k := range keys {
			if i > 0 {
				sb.WriteByte(',')
			}
			if f.hexns {
				sb.WriteString("(X'62656e6368',")
			} else {
				sb.WriteString("('bench',")
			}
			if timed {
				kt, _ := mysqlstore.UUIDv7KeyTime(k)
				sb.WriteString(strconv.FormatInt(kt.UnixMicro(), 10) + ",")
			}
			fmt.Fprintf(&sb, "X'%x',X'%x',1,", keyHash(k), k)
			if f.seq {
				sb.WriteString("NEXTVAL(idem_records_token),")
			} else {
				sb.WriteString("1,")
			}
			sb.WriteString("12345,X'',NULL,1,'',604800000000,")
			if f.now {
				fmt.Fprintf(&sb, "%s+60000000,%s+604800000000,%s,%s)", nowUS, nowUS, nowUS, nowUS)
			} else {
				fmt.Fprintf(&sb, "%d,%d,%d,%d)", now+60e6, now+604800e6, now, now)
			}
		}
		if f.odku {
			sb.WriteString(" ON DUPLICATE KEY UPDATE k = k")
		}
		if f.ret {
			sb.WriteString(" RETURNING " + recCols)
		}
		return sb.String()
	}
	keys := func() [][]byte {
		ks := make([][]byte, o.batch)
		for i := range ks {
			ks[i] = g.next()
		}
		return ks
	}
	stmt := func(f feat) func(ctx context.Context, _ int) (int, error) {
		return func(ctx context.Context, _ int) (int, error) {
			q := build(f, keys())
			if f.ret {
				rows, err := db.QueryContext(ctx, q)
				if err != nil {
					return 0, err
				}
				for rows.Next() {
				}
				return o.batch, rows.Close()
			}
			_, err := db.ExecContext(ctx, q)
			return o.batch, err
		}
	}
	variants := []struct {
		name string
		fn   func(ctx context.Context, _ int) (int, error)
	}{
		{"raw", stmt(feat{})},
		{"raw+odku-noop", stmt(feat{odku: true})},
		{"raw+returning", stmt(feat{ret: true})},
		{"raw+nextval", stmt(feat{seq: true})},
		{"raw+now-exprs", stmt(feat{now: true})},
		{"all, VALUES rows", stmt(feat{seq: true, now: true, ret: true, hexns: true})},
		{"all, derived rows", stmt(feat{seq: true, now: true, ret: true, hexns: true, derived: true})},
		{"ClaimBatch", func(ctx context.Context, _ int) (int, error) {
			reqs := make([]idem.ClaimRequest, o.batch)
			for i, k := range keys() {
				reqs[i] = idem.ClaimRequest{Key: k, Lease: time.Minute, TTL: 7 * 24 * time.Hour}
			}
			res, err := s.ClaimBatch(ctx, reqs)
			for _, r := range res {
				if err == nil && (r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired) {
					err = fmt.Errorf("batch entry: %+v", r)
				}
			}
			return o.batch, err
		}},
	}
	type acc struct {
		rate, srv, cli []float64
	}
	res := map[string]*acc{}
	for rep := 0; rep < o.repeat; rep++ {
		for _, c := range o.callers {
			unlock := o.lock.hold(fmt.Sprintf("decompose %s x%d round %d", l, c, rep+1))
			for _, v := range variants {
				s0, c0 := procCPU(pid), selfCPU()
				r, err := measure(ctx, c, o.dur, 1, v.fn)
				if err != nil {
					unlock()
					return fmt.Errorf("%s: %w", v.name, err)
				}
				s1, c1 := procCPU(pid), selfCPU()
				k := fmt.Sprintf("%s|%d", v.name, c)
				a := res[k]
				if a == nil {
					a = &acc{}
					res[k] = a
				}
				a.rate = append(a.rate, r.rate())
				a.srv = append(a.srv, float64(s1-s0)/float64(time.Millisecond)/float64(r.calls))
				a.cli = append(a.cli, float64(c1-c0)/float64(time.Millisecond)/float64(r.calls))
				fmt.Fprintf(os.Stderr, "  %-16s x%-3d %8.0f rows/s  server %.2f ms/stmt  client %.2f ms/stmt  p50 %v\n", v.name, c, r.rate(), a.srv[len(a.srv)-1], a.cli[len(a.cli)-1], r.p50)
			}
			unlock()
		}
	}
	med := func(x []float64) float64 {
		y := append([]float64(nil), x...)
		for i := range y {
			for j := i + 1; j < len(y); j++ {
				if y[j] < y[i] {
					y[i], y[j] = y[j], y[i]
				}
			}
		}
		return y[len(y)/2]
	}
	fmt.Printf("| layout | statement (%d rows) | callers | rows/s | ÷ raw | server CPU ms/stmt | client CPU ms/stmt |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n", o.batch)
	for _, c := range o.callers {
		raw := med(res[fmt.Sprintf("raw|%d", c)].rate)
		for _, v := range variants {
			a := res[fmt.Sprintf("%s|%d", v.name, c)]
			fmt.Printf("| %s | %s | %d | %.0f | %.2f | %.2f | %.2f |\n", l, v.name, c, med(a.rate), med(a.rate)/raw, med(a.srv), med(a.cli))
		}
	}
	return nil
}

// serverPID finds mariadbd (or mysqld) in /proc; 0 if not visible.
func serverPID() int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/comm")
		if c := strings.TrimSpace(string(b)); c == "mariadbd" || c == "mysqld" {
			return pid
		}
	}
	return 0
}

// procCPU is pid's user+system CPU time (clock ticks of 10 ms).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
