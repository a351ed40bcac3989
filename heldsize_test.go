package idem

import (
	"testing"
	"unsafe"
)

// A batch consumer allocates a Held per message, one of the largest
// objects of its path: it stays within the allocator's 384-byte size
// class. A single claim's Held (Acquire, Do) comes with its first settle
// round's context in one object that stays within the 480-byte class
// (the Held alone was 480 bytes before the context moved out of it).
func TestHeldSize(t *testing.T) {
	if n := unsafe.Sizeof(Held{}); n > 384 {
		t.Errorf("Held is %d bytes, want at most 384", n)
	}
	if n := unsafe.Sizeof(heldAlone{}); n > 480 {
		t.Errorf("heldAlone is %d bytes, want at most 480", n)
	}
}
