package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChartsFromRepository draws every chart from the repository's
// benchmark outputs: the files still parse, every benchmark a chart names
// is in its file, and each PNG decodes.
func TestChartsFromRepository(t *testing.T) {
	charts, err := build("../../docs/benchmarks")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := write(charts, dir); err != nil {
		t.Fatal(err)
	}
	for _, c := range charts {
		f, err := os.Open(filepath.Join(dir, c.File))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", c.File, err)
		}
		if b := img.Bounds(); b.Dx() < 900 || b.Dy() < 500 {
			t.Errorf("%s: %v", c.File, b)
		}
	}
}

func TestReadGoBench(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "b.txt")
	os.WriteFile(f, []byte(strings.Join([]string{
		"goos: linux",
		"BenchmarkX/a=1-2   \t 100\t  2000 ns/op\t  500 claims/s\t 12 B/op",
		"BenchmarkX/a=1-2   \t 100\t  1000 ns/op\t  900 claims/s",
		"BenchmarkX/a=1-2   \t 100\t  4000 ns/op\t  700 claims/s",
		"--- BENCH: BenchmarkX/a=1-2",
		"    bench.go:1: 3 batches",
	}, "\n")), 0o644)
	g, err := readGoBench(f)
	if err != nil {
		t.Fatal(err)
	}
	st, err := g.get("BenchmarkX/a=1", "claims/s")
	if err != nil || st != (stat{Med: 700, Min: 500, Max: 900, N: 3}) {
		t.Errorf("claims/s: %+v %v", st, err)
	}
	if st, _ := g.get("BenchmarkX/a=1", "op/s"); st.Med != 5e5 {
		t.Errorf("op/s median %v, want 1e9/2000", st.Med)
	}
	if _, err := g.get("BenchmarkY", "claims/s"); err == nil {
		t.Error("a missing benchmark must be an error")
	}
}

func TestHuman(t *testing.T) {
	for v, want := range map[float64]string{4087000: "4.09M", 56562: "56.6k", 3149: "3.15k", 812: "812", 12.5: "12.5", 0.69: "0.69", 1000000: "1M", 20000: "20k"} {
		if got := human(v); got != want {
			t.Errorf("human(%v) = %q, want %q", v, got, want)
		}
	}
}
