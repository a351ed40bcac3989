package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runDemoJSON runs `idem demo --json` with args and decodes its object.
func runDemoJSON(t *testing.T, args ...string) (demoReport, int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"--json", "demo"}, args...), &out, &errb)
	var rep demoReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, stdout is not one JSON object: %v\nstdout:\n%s\nstderr:\n%s", code, err, out.String(), errb.String())
	}
	if n := strings.Count(strings.TrimSpace(out.String()), "\n"); n != 0 {
		t.Fatalf("stdout has %d lines, want one object:\n%s", n+1, out.String())
	}
	return rep, code, errb.String()
}

// TestDemoExactlyOnce runs the whole chain small: the faults are injected
// and hit work in flight (duplicate deliveries, lost acks, a crashed
// consumer holding unsettled deliveries), and every effect happens once.
func TestDemoExactlyOnce(t *testing.T) {
	dir := t.TempDir()
	rep, code, stderr := runDemoJSON(t, "-dir", dir, "-messages", "400", "-crashes", "1", "-consumers", "2", "-workers", "8",
		"-dup", "0.25", "-lost-acks", "0.05", "-lost-publish-acks", "0.1", "-seed", "42")
	if code != 0 || !rep.ExactlyOnce || rep.Error != "" {
		t.Fatalf("exit %d, report %+v\nstderr:\n%s", code, rep, stderr)
	}
	if rep.Messages != 400 || rep.Effects != 400 || rep.DuplicateEffects != 0 || rep.Lost != 0 {
		t.Errorf("messages %d effects %d duplicate effects %d lost %d; want 400 400 0 0", rep.Messages, rep.Effects, rep.DuplicateEffects, rep.Lost)
	}
	// The faults were injected and reached the consumers.
	if rep.DuplicatePublishes == 0 || rep.LostAcks == 0 || rep.LostPublishAcks == 0 {
		t.Errorf("faults not injected: duplicate publishes %d, lost acks %d, lost publish acks %d", rep.DuplicatePublishes, rep.LostAcks, rep.LostPublishAcks)
	}
	if rep.Crashes != 1 || rep.AbandonedDeliveries == 0 {
		t.Errorf("crashes %d abandoning %d deliveries; want 1 crash holding unsettled deliveries", rep.Crashes, rep.AbandonedDeliveries)
	}
	// Phase 1 delivers every message at least once plus the duplicate
	// publishes; the restart's new group delivers the whole stream again.
	if rep.Deliveries < 2*400+rep.DuplicatePublishes || rep.DuplicatesDelivered != rep.Deliveries-400 {
		t.Errorf("deliveries %d, duplicates delivered %d, duplicate publishes %d", rep.Deliveries, rep.DuplicatesDelivered, rep.DuplicatePublishes)
	}
	if rep.Replays < rep.DuplicatesDelivered-rep.AbandonedDeliveries-rep.LostAcks-int64(400) || rep.ReplayPhaseEffects != 0 {
		t.Errorf("replays %d, effects in the replay phase %d", rep.Replays, rep.ReplayPhaseEffects)
	}
	if rep.MsgsPerSec <= 0 || rep.P99Ms <= 0 || rep.P50Ms > rep.P99Ms {
		t.Errorf("msgs/s %v p50 %v p99 %v", rep.MsgsPerSec, rep.P50Ms, rep.P99Ms)
	}
	for _, f := range []string{"app.db", "idem.db", "jetstream"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("-dir: %v", err)
		}
	}
}

// TestDemoFailsOnBrokenChain: the demo's own check catches an effect
// applied twice and an effect lost, and exits non-zero.
func TestDemoFailsOnBrokenChain(t *testing.T) {
	for _, tc := range []struct {
		fault     string
		dup, lost int64
	}{
		{"duplicate-effect", 1, 0},
		{"lost", 0, 1},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			demoTestFault = tc.fault
			defer func() { demoTestFault = "" }()
			rep, code, _ := runDemoJSON(t, "-messages", "100", "-crashes", "0", "-lost-acks", "0", "-dup", "0", "-seed", "7")
			if code != 1 || rep.ExactlyOnce {
				t.Errorf("exit %d, exactly_once %v; want 1, false", code, rep.ExactlyOnce)
			}
			if rep.DuplicateEffects != tc.dup || rep.Lost != tc.lost {
				t.Errorf("duplicate effects %d, lost %d; want %d, %d", rep.DuplicateEffects, rep.Lost, tc.dup, tc.lost)
			}
		})
	}
	// The text output says so too.
	demoTestFault = "duplicate-effect"
	defer func() { demoTestFault = "" }()
	var out, errb bytes.Buffer
	if code := run([]string{"demo", "-messages", "50", "-crashes", "0", "-lost-acks", "0", "-dup", "0"}, &out, &errb); code != 1 ||
		!strings.Contains(out.String(), "1 applied more than once") || !strings.Contains(out.String(), "EXACTLY-ONCE VIOLATED") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
}
