// Package leakcheck fails a test binary that leaves goroutines running, the
// way go.uber.org/goleak does, for the core module, which takes no
// third-party code even in tests.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests and then waits up to five seconds for the goroutine
// count to fall back to what it was before them; it exits non-zero with the
// stacks when it does not. Call it from TestMain.
func Main(m *testing.M) {
	before, _ := goroutines()
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		n, stacks := goroutines()
		for n > before && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			n, stacks = goroutines()
		}
		if n > before {
			fmt.Fprintf(os.Stderr, "leaked goroutines: %d before, %d after\n%s\n", before, n, stacks)
			code = 1
		}
	}
	os.Exit(code)
}

// goroutines counts goroutines other than signal handling (fuzz mode).
func goroutines() (int, string) {
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	n := 0
	for _, g := range strings.Split(stacks, "\n\n") {
		if !strings.Contains(g, "os/signal.") {
			n++
		}
	}
	return n, stacks
}
