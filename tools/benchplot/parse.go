package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// stat summarises the values a benchmark gave over its runs.
type stat struct {
	Med, Min, Max float64
	N             int
}

func summarize(vs []float64) stat {
	if len(vs) == 0 {
		return stat{}
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Med: med, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// goBench is the Go benchmark output of some files: for each benchmark
// (name without the -GOMAXPROCS suffix) and unit, every value reported.
type goBench map[string]map[string][]float64

var procsSuffix = regexp.MustCompile(`-\d+$`)

// readGoBench reads "BenchmarkName-2  N  v unit  v unit ..." lines from
// files (other lines are ignored). ns/op also gives "op/s".
func readGoBench(files ...string) (goBench, error) {
	out := goBench{}
	for _, f := range files {
		if err := eachLine(f, func(line string) error {
			fields := strings.Fields(line)
			if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
				return nil
			}
			if _, err := strconv.Atoi(fields[1]); err != nil {
				return nil // a "--- BENCH:" header or a log line
			}
			name := procsSuffix.ReplaceAllString(fields[0], "")
			if out[name] == nil {
				out[name] = map[string][]float64{}
			}
			for i := 2; i+1 < len(fields); i += 2 {
				v, err := strconv.ParseFloat(fields[i], 64)
				if err != nil {
					return fmt.Errorf("%q: value %q: %w", line, fields[i], err)
				}
				unit := fields[i+1]
				out[name][unit] = append(out[name][unit], v)
				if unit == "ns/op" && v > 0 {
					out[name]["op/s"] = append(out[name]["op/s"], 1e9/v)
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// get is the summary of name's unit; it fails when the benchmark is not
// in the files (a renamed benchmark must not draw an empty bar).
func (g goBench) get(name, unit string) (stat, error) {
	vs := g[name][unit]
	if len(vs) == 0 {
		return stat{}, fmt.Errorf("benchmark %s: no %q values", name, unit)
	}
	return summarize(vs), nil
}

// redisRow is one line of redisstore/bench.sh's table.
type redisRow struct {
	Mode                      string
	Clients                   int
	BaseRate, BaseP50, BaseP9 float64 // redis-benchmark SET NX
	Rate, P50, P99            float64 // the store
}

var redisLine = regexp.MustCompile(`^\d+\s+(\w+)\s+(\d+)\s+\|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\|`)

func readRedis(file string) ([]redisRow, error) {
	var rows []redisRow
	err := eachLine(file, func(line string) error {
		m := redisLine.FindStringSubmatch(line)
		if m == nil {
			return nil
		}
		var f [6]float64
		for i := range f {
			f[i], _ = strconv.ParseFloat(m[3+i], 64)
		}
		c, _ := strconv.Atoi(m[2])
		rows = append(rows, redisRow{Mode: m[1], Clients: c, BaseRate: f[0], BaseP50: f[1], BaseP9: f[2], Rate: f[3], P50: f[4], P99: f[5]})
		return nil
	})
	if err == nil && len(rows) == 0 {
		err = fmt.Errorf("%s: no result rows", file)
	}
	return rows, err
}

// pgRow is one line of pgbench-idem's table.
type pgRow struct {
	Layout, Mode string
	Callers      int
	Rate         float64
	P50, P99     float64
}

// readPG reads the result rows of the section of file whose "## " header
// starts with section (up to the next such header).
func readPG(file, section string) ([]pgRow, error) {
	var rows []pgRow
	in := false
	err := eachLine(file, func(line string) error {
		if strings.HasPrefix(line, "## ") && !strings.HasPrefix(line, "## flock") && !strings.HasPrefix(line, "## /") {
			in = strings.HasPrefix(line[3:], section)
			return nil
		}
		if !in || !strings.HasPrefix(line, "| ") {
			return nil
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if len(cells) < 6 {
			return nil
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		callers, err := strconv.Atoi(cells[2])
		if err != nil {
			return nil // the header
		}
		r := pgRow{Layout: cells[0], Mode: cells[1], Callers: callers}
		r.Rate, _ = strconv.ParseFloat(cells[3], 64)
		r.P50, _ = strconv.ParseFloat(cells[4], 64)
		r.P99, _ = strconv.ParseFloat(cells[5], 64)
		rows = append(rows, r)
		return nil
	})
	if err == nil && len(rows) == 0 {
		err = fmt.Errorf("%s: no result rows in section %q", file, section)
	}
	return rows, err
}

func eachLine(file string, fn func(string) error) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return scanLines(f, filepath.Base(file), fn)
}

func scanLines(r io.Reader, name string, fn func(string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if err := fn(sc.Text()); err != nil {
			return fmt.Errorf("%s:%d: %w", name, n, err)
		}
	}
	return sc.Err()
}
