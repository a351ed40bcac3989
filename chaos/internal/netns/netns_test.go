package netns

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCreatePartitionDelete needs root and iproute2 (the harness's partition
// scenario does too); it fails, not skips, where they are missing.
func TestCreatePartitionDelete(t *testing.T) {
	ns, err := Create()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Delete()
	state := func() string {
		out, err := exec.Command("ip", "-o", "link", "show", ns.storeIf).Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	if !strings.Contains(state(), "state UP") && !strings.Contains(state(), ",UP") {
		t.Fatalf("store link not up: %s", state())
	}
	if err := ns.Partition(true); err != nil {
		t.Fatal(err)
	}
	if !ns.Partitioned() || strings.Contains(state(), ",UP") {
		t.Fatalf("store link not cut: %s", state())
	}
	if err := ns.Partition(false); err != nil {
		t.Fatal(err)
	}
	// The broker link stays up throughout.
	out, err := exec.Command("ip", "-o", "link", "show", ns.brokerIf).Output()
	if err != nil || !strings.Contains(string(out), ",UP") {
		t.Fatalf("broker link: %s %v", out, err)
	}
	if got := ns.Command("true"); len(got) != 5 || got[3] != ns.Name {
		t.Fatalf("Command = %v", got)
	}
	if err := ns.Delete(); err != nil {
		t.Fatal(err)
	}
	if exec.Command("ip", "netns", "exec", ns.Name, "true").Run() == nil {
		t.Fatal("namespace still there")
	}
}
