// Command benchplot draws the figures of docs/benchmarks.md as charts:
// each measurement beside its baseline from the same run, and latency
// percentiles, read from the raw benchmark outputs kept in docs/benchmarks/
// (go test -bench output, redisstore/bench.sh's and pgbench-idem's tables).
// From the repository root:
//
//	go run ./tools/benchplot            # writes docs/benchmarks/charts/*.png
//	go run ./tools/benchplot -in DIR -out DIR
//
// Each bar is the median of the runs in the file, the whisker spans the
// smallest and largest run, the median is written above the bar. A chart
// whose benchmark is missing from its file is an error, not an empty bar.
package main

import (
	"flag"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
)

func main() {
	in := flag.String("in", "docs/benchmarks", "directory of the benchmark outputs")
	out := flag.String("out", "docs/benchmarks/charts", "directory the PNGs are written to")
	flag.Parse()
	charts, err := build(*in)
	if err == nil {
		err = write(charts, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
	for _, c := range charts {
		fmt.Println(filepath.Join(*out, c.File))
	}
}

func write(charts []*chart, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range charts {
		if err := render(c, filepath.Join(dir, c.File)); err != nil {
			return fmt.Errorf("%s: %w", c.File, err)
		}
	}
	return nil
}

// build reads the outputs under dir and returns every chart.
func build(dir string) ([]*chart, error) {
	var charts []*chart
	for _, f := range []func(string) (*chart, error){
		snowflakeChart, coreChart, boltChart, redisChart, pgChart, brokerChart, httpChart, latencyRedisChart, latencyPGChart,
	} {
		c, err := f(dir)
		if err != nil {
			return nil, err
		}
		charts = append(charts, c)
	}
	return charts, nil
}

// fromBench fills one series per (name, benchmark-name pattern) over the
// groups: name(group) is the benchmark's name.
func fromBench(g goBench, unit string, groups []string, names []string, bench func(series, group int) string) ([]series, error) {
	out := make([]series, len(names))
	for s, n := range names {
		out[s] = series{Name: n, Color: palette[s%len(palette)]}
		for gi := range groups {
			name := bench(s, gi)
			if name == "" {
				out[s].Vals = append(out[s].Vals, stat{})
				continue
			}
			st, err := g.get(name, unit)
			if err != nil {
				return nil, err
			}
			out[s].Vals = append(out[s].Vals, st)
		}
	}
	return out, nil
}

func snowflakeChart(dir string) (*chart, error) {
	g, err := readGoBench(filepath.Join(dir, "snowflake.txt"))
	if err != nil {
		return nil, err
	}
	c := &chart{File: "snowflake.png", Title: "Snowflake ids: one generator beside the layout's ceiling", YLabel: "ids/s",
		Note: "snowflake.txt: BenchmarkRate, 10 runs; ceiling = 4,096 ids/ms measured the same way", Groups: []string{"ids/s"}}
	impl := []string{"generator", "ceiling"}
	c.Series, err = fromBench(g, "ids/s", c.Groups, []string{"snowflake.Generator", "ceiling (4,096/ms)"}, func(s, _ int) string {
		return "BenchmarkRate/impl=" + impl[s]
	})
	if err == nil {
		c.Groups[0] = fmt.Sprintf("the generator at %.1f%% of the ceiling (medians)", 100*c.Series[0].Vals[0].Med/c.Series[1].Vals[0].Med)
	}
	return c, err
}

func coreChart(dir string) (*chart, error) {
	g, err := readGoBench(filepath.Join(dir, "core.txt"))
	if err != nil {
		return nil, err
	}
	c := &chart{File: "core.png", Title: "Guard over memstore beside a bare sharded map and sync.Map", YLabel: "claim+complete/s",
		Note:   "core.txt: BenchmarkClaimComplete, 10 runs (1e9 / ns per op)",
		Groups: []string{"1 goroutine per core", "2 goroutines per core"}}
	impl := []string{"guard", "memstore-raw", "shardedmap", "syncmap"}
	gs := []string{"1xcores", "2xcores"}
	c.Series, err = fromBench(g, "op/s", c.Groups, []string{"idem.Guard on memstore", "memstore alone", "bare sharded map (baseline)", "sync.Map"}, func(s, gi int) string {
		return "BenchmarkClaimComplete/" + impl[s] + "/g=" + gs[gi]
	})
	if err == nil {
		c.Series[1].Color, c.Series[2].Color, c.Series[3].Color = palette[3], palette[1], palette[4]
		for gi := range c.Groups {
			c.Groups[gi] += fmt.Sprintf("\nguard %.2fx the sharded map (medians)", c.Series[0].Vals[gi].Med/c.Series[2].Vals[gi].Med)
		}
	}
	return c, err
}

func boltChart(dir string) (*chart, error) {
	g, err := readGoBench(filepath.Join(dir, "boltstore-quiet.txt"))
	if err != nil {
		return nil, err
	}
	c := &chart{File: "boltstore.png", Title: "boltstore (group commit) beside an fsync per claim, 64 callers", YLabel: "claims/s (log scale)",
		Note:   "boltstore-quiet.txt: BenchmarkClaim, 3 runs each, quiet machine",
		Groups: []string{"single claims", "batches of 100"}, Log: true}
	impl := []string{"boltstore-group", "bbolt-update-per-claim", "boltstore-always", "memstore"}
	modes := []string{"single", "batch100"}
	c.Series, err = fromBench(g, "claims/s", c.Groups, []string{"boltstore (group commit)", "bbolt Update per claim (baseline)", "boltstore, fsync per op", "memstore (no disk)"}, func(s, gi int) string {
		return "BenchmarkClaim/" + modes[gi] + "/callers=64/" + impl[s]
	})
	return c, err
}

func redisChart(dir string) (*chart, error) {
	rows, err := readRedis(filepath.Join(dir, "redisstore-2026-12-01c-pinned.txt"))
	if err != nil {
		return nil, err
	}
	type cell struct {
		mode    string
		clients int
	}
	cells := []cell{{"single", 1}, {"single", 8}, {"single", 64}, {"coalesced", 1}, {"coalesced", 8}, {"coalesced", 64}, {"batch64", 1}, {"batch64", 8}, {"batch64", 64}}
	c := &chart{File: "redisstore.png", Title: "redisstore beside redis-benchmark SET NX on the same server", YLabel: "claims/s (log scale)",
		Note: "redisstore-2026-12-01c-pinned.txt: 5 rounds (bars: medians; % : median of the rounds' ratios); single/coalesced vs SET NX -P 1, batch of 64 vs -P 64", Log: true}
	idem := series{Name: "redisstore", Color: palette[0]}
	base := series{Name: "redis-benchmark SET NX (baseline)", Color: palette[1]}
	for _, cl := range cells {
		var mine, theirs, ratios []float64
		for _, r := range rows {
			if r.Mode == cl.mode && r.Clients == cl.clients {
				mine, theirs = append(mine, r.Rate), append(theirs, r.BaseRate)
				ratios = append(ratios, r.Rate/r.BaseRate)
			}
		}
		if len(mine) == 0 {
			return nil, fmt.Errorf("redisstore: no rows for %s at %d clients", cl.mode, cl.clients)
		}
		// The baseline is re-measured each round and swings: the ratio is
		// the median of the rounds' ratios, as docs/benchmarks/redisstore.md
		// quotes it, not the ratio of the bars' medians.
		c.Groups = append(c.Groups, fmt.Sprintf("%s\n%d client%s\n%.0f%% of SET NX", cl.mode, cl.clients, plural(cl.clients), 100*summarize(ratios).Med))
		idem.Vals, base.Vals = append(idem.Vals, summarize(mine)), append(base.Vals, summarize(theirs))
	}
	c.Series = []series{idem, base}
	return c, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// pgSection is the run of pgstore-2026-12-01-quiet-10m.txt drawn: the
// standard command on the final code.
const pgSection = "Run G"

func pgChart(dir string) (*chart, error) {
	rows, err := readPG(filepath.Join(dir, "pgstore-2026-12-01-quiet-10m.txt"), pgSection)
	if err != nil {
		return nil, err
	}
	c := &chart{File: "pgstore.png", Title: "pgstore ClaimBatch(100) beside a raw multi-row INSERT ON CONFLICT DO NOTHING, 10M rows", YLabel: "claims/s",
		Note: "pgstore-2026-12-01-quiet-10m.txt, " + pgSection + " (standard command, final code); each bar one 3-round cell"}
	idem := series{Name: "ClaimBatch(100)", Color: palette[0]}
	base := series{Name: "raw INSERT ... ON CONFLICT DO NOTHING, 100 rows (baseline)", Color: palette[1]}
	for _, layout := range []string{"single", "time_ordered"} {
		for _, callers := range []int{1, 8, 64} {
			b, err := pgCell(rows, layout, "ClaimBatch(100)", callers)
			if err != nil {
				return nil, err
			}
			r, err := pgCell(rows, layout, "raw INSERT ON CONFLICT DO NOTHING (100 rows)", callers)
			if err != nil {
				return nil, err
			}
			name := map[string]string{"single": "random keys", "time_ordered": "time-ordered"}[layout]
			c.Groups = append(c.Groups, fmt.Sprintf("%s\n%d caller%s\n%.0f%% of raw", name, callers, plural(callers), 100*b.Rate/r.Rate))
			idem.Vals = append(idem.Vals, summarize([]float64{b.Rate}))
			base.Vals = append(base.Vals, summarize([]float64{r.Rate}))
		}
	}
	c.Series = []series{idem, base}
	return c, nil
}

func pgCell(rows []pgRow, layout, mode string, callers int) (pgRow, error) {
	for _, r := range rows {
		if r.Layout == layout && r.Mode == mode && r.Callers == callers {
			return r, nil
		}
	}
	return pgRow{}, fmt.Errorf("pgstore %s: no %s row for %s at %d callers", pgSection, mode, layout, callers)
}

func brokerChart(dir string) (*chart, error) {
	c := &chart{File: "brokers.png", Title: "Guarded batch consume into PostgreSQL beside the same consumer without the guard", YLabel: "msgs/s (log scale)",
		Note:   "BenchmarkConsumeBatchPG in natsbroker-quiet, kafkabroker-quiet (kfake), rabbitbroker-run1+2, streamsbroker-run1, rocketbroker-run1 (in-process fake).txt",
		Log:    true,
		Groups: []string{"NATS JetStream", "Kafka (kfake)", "RabbitMQ", "Redis Streams", "RocketMQ (fake broker)"}}
	files := [][]string{{"natsbroker-quiet.txt"}, {"kafkabroker-quiet.txt"}, {"rabbitbroker-run1.txt", "rabbitbroker-run2.txt"}, {"streamsbroker-run1.txt"}, {"rocketbroker-run1.txt"}}
	bs := make([]goBench, len(files))
	for i, fs := range files {
		var paths []string
		for _, f := range fs {
			paths = append(paths, filepath.Join(dir, f))
		}
		var err error
		if bs[i], err = readGoBench(paths...); err != nil {
			return nil, err
		}
	}
	impl := []string{"guard", "guard-pgstore", "baseline"}
	names := []string{"guard, records in memstore", "guard, records in pgstore", "no guard (baseline)"}
	for s, n := range names {
		sr := series{Name: n, Color: palette[[]int{0, 2, 1}[s]]}
		for gi := range c.Groups {
			name := "BenchmarkConsumeBatchPG/" + impl[s]
			if len(bs[gi][name]) == 0 && impl[s] == "guard-pgstore" {
				sr.Vals = append(sr.Vals, stat{}) // Kafka's quiet run has no pgstore cell
				continue
			}
			st, err := bs[gi].get(name, "msgs/s")
			if err != nil {
				return nil, fmt.Errorf("%s: %w", files[gi][0], err)
			}
			sr.Vals = append(sr.Vals, st)
		}
		c.Series = append(c.Series, sr)
	}
	return c, nil
}

func httpChart(dir string) (*chart, error) {
	g, err := readGoBench(filepath.Join(dir, "httpapi.txt"))
	if err != nil {
		return nil, err
	}
	type cell struct{ store, clients, batch, label string }
	cells := []cell{
		{"memstore", "1xcores", "1", "memstore\none claim per request"},
		{"memstore", "1xcores", "100", "memstore\nbatches of 100"},
		{"redis", "1xcores", "1", "Redis\none claim per request"},
		{"redis", "1xcores", "100", "Redis\nbatches of 100"},
	}
	c := &chart{File: "httpapi.png", Title: "idem serve's HTTP API beside the store in process and a do-nothing handler", YLabel: "claims/s (log scale)",
		Note: "httpapi.txt: BenchmarkHTTPClaims, 7 interleaved rounds, 1 client per core, shared machine (load 11-16)", Log: true}
	for _, cl := range cells {
		c.Groups = append(c.Groups, cl.label)
	}
	impl := []string{"http", "inprocess", "bare-http"}
	c.Series, err = fromBench(g, "claims/s", c.Groups, []string{"over HTTP (idem serve)", "store in process", "do-nothing net/http handler (baseline)"}, func(s, gi int) string {
		cl := cells[gi]
		if impl[s] == "bare-http" && cl.store == "redis" {
			return "" // measured once, on memstore: it touches no store
		}
		return "BenchmarkHTTPClaims/" + cl.store + "/clients=" + cl.clients + "/batch=" + cl.batch + "/" + impl[s]
	})
	if err == nil {
		c.Series[1].Color, c.Series[2].Color = palette[3], palette[1]
	}
	return c, err
}

func latencyRedisChart(dir string) (*chart, error) {
	rows, err := readRedis(filepath.Join(dir, "redisstore-2026-12-01c-pinned.txt"))
	if err != nil {
		return nil, err
	}
	c := &chart{File: "latency-redisstore.png", Title: "redisstore single Claim latency beside SET NX (redis-benchmark -P 1)", YLabel: "ms (log scale)",
		Note: "redisstore-2026-12-01c-pinned.txt: p50 and p99 per round, 5 rounds", Log: true}
	var s [4]series
	for i, n := range []string{"Claim p50", "SET NX p50 (baseline)", "Claim p99", "SET NX p99 (baseline)"} {
		s[i] = series{Name: n, Color: []color.Color{palette[0], palette[1], palette[2], color.RGBA{0x5b, 0x62, 0x70, 0xff}}[i]}
	}
	for _, cl := range []int{1, 8, 64} {
		var v [4][]float64
		for _, r := range rows {
			if r.Mode == "single" && r.Clients == cl {
				v[0], v[1], v[2], v[3] = append(v[0], r.P50), append(v[1], r.BaseP50), append(v[2], r.P99), append(v[3], r.BaseP9)
			}
		}
		if len(v[0]) == 0 {
			return nil, fmt.Errorf("redisstore: no single rows at %d clients", cl)
		}
		c.Groups = append(c.Groups, fmt.Sprintf("%d client%s", cl, plural(cl)))
		for i := range s {
			s[i].Vals = append(s[i].Vals, summarize(v[i]))
		}
	}
	c.Series = s[:]
	return c, nil
}

func latencyPGChart(dir string) (*chart, error) {
	rows, err := readPG(filepath.Join(dir, "pgstore-2026-12-01-quiet-10m.txt"), pgSection)
	if err != nil {
		return nil, err
	}
	c := &chart{File: "latency-pgstore.png", Title: "pgstore single Claim latency beside a one-row INSERT ON CONFLICT DO NOTHING, 10M rows", YLabel: "ms (log scale)",
		Note: "pgstore-2026-12-01-quiet-10m.txt, " + pgSection + ", random keys; synchronous_commit=on (448 µs per fdatasync on this VM)", Log: true}
	var s [4]series
	for i, n := range []string{"Claim p50", "raw INSERT p50 (baseline)", "Claim p99", "raw INSERT p99 (baseline)"} {
		s[i] = series{Name: n, Color: []color.Color{palette[0], palette[1], palette[2], color.RGBA{0x5b, 0x62, 0x70, 0xff}}[i]}
	}
	for _, callers := range []int{1, 8, 64} {
		cl, err := pgCell(rows, "single", "Claim", callers)
		if err != nil {
			return nil, err
		}
		raw, err := pgCell(rows, "single", "raw INSERT ON CONFLICT DO NOTHING (1 row)", callers)
		if err != nil {
			return nil, err
		}
		c.Groups = append(c.Groups, fmt.Sprintf("%d caller%s", callers, plural(callers)))
		for i, v := range []float64{cl.P50, raw.P50, cl.P99, raw.P99} {
			s[i].Vals = append(s[i].Vals, summarize([]float64{v}))
		}
	}
	c.Series = s[:]
	return c, nil
}
