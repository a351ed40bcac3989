package e2etest

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSchedstatWait(t *testing.T) {
	for _, tc := range []struct {
		line string
		want time.Duration
	}{
		{"1234567 89012345 678\n", 89012345},
		{"5 0 1", 0},
		{"", 0},
		{"12", 0},
		{"1 x 2", 0},
	} {
		if got := schedstatWait(tc.line); got != tc.want {
			t.Errorf("schedstatWait(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

// TestRunQueueWait: on Linux the kernel's schedstat lines have the
// fields RunQueueWait reads, and its sum over the threads is at least what
// the main thread alone had waited before it (the counters only grow; no
// timing asserted).
func TestRunQueueWait(t *testing.T) {
	if runtime.GOOS != "linux" {
		if got := RunQueueWait(); got != 0 {
			t.Fatalf("RunQueueWait = %v off Linux, want 0", got)
		}
		return
	}
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/schedstat")
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(b)); len(f) != 3 {
		t.Fatalf("schedstat %q: want 3 fields", b)
	}
	lead := schedstatWait(string(b))
	if w := RunQueueWait(); w < lead {
		t.Fatalf("RunQueueWait = %v, less than the main thread's %v alone", w, lead)
	}
}
