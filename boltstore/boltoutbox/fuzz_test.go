package boltoutbox

import (
	"bytes"
	"testing"
)

// FuzzDecodeRow: decodeRow never panics on a damaged file's bytes, and what
// it accepts re-encodes to bytes that decode to the same row (varints may
// come in a longer form than encode writes).
func FuzzDecodeRow(f *testing.F) {
	f.Add((&row{status: 1, attempts: 3, next: 5, created: -1, updated: 1 << 62, id: []byte("id"), topic: []byte("t"),
		key: []byte{0, 0xff}, headers: []byte{1, 1, 'a', 0}, payload: []byte("p"), lastErr: []byte("e")}).encode())
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRow(b)
		if err != nil {
			return
		}
		again, err := decodeRow(r.encode())
		if err != nil || !bytes.Equal(again.encode(), r.encode()) {
			t.Fatalf("%x decodes to %+v, which does not survive a round trip (%+v, %v)", b, r, again, err)
		}
	})
}
