package shm

import (
	"path/filepath"
	"testing"
)

// TestSharedMapping: what one mapping writes, another mapping of the same
// file reads at once (the harness reads a worker's counters this way).
func TestSharedMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.shm")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.Add(InHandler, 3)
	w.Add(InHandler, -1)
	w.Set(Pid, 42)
	if got := r.Get(InHandler); got != 2 {
		t.Fatalf("InHandler = %d, want 2", got)
	}
	v := r.Snapshot()
	if v[Pid] != 42 || Sum(v, v)[InHandler] != 4 {
		t.Fatalf("snapshot %v", v)
	}
	if InHandler.String() != "in_handler" || NSlots.String() == "" {
		t.Fatal("slot names")
	}
	if len(names) != int(NSlots) {
		t.Fatalf("%d names for %d slots", len(names), NSlots)
	}
}
