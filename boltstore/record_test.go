package boltstore

import (
	"bytes"
	"testing"

	"github.com/idem-dev/idem"
)

func TestRecordRoundTrip(t *testing.T) {
	tests := []rec{
		{state: idem.StateInProgress, token: 1, attempts: 1, ttl: 1e9, leaseUntil: 5, expiresAt: 6, created: 1, updated: 2},
		{state: idem.StateCompleted, token: 1 << 62, attempts: 3, fp: []byte{0, 1}, result: bytes.Repeat([]byte{0xff}, 1000), lastErr: "boom"},
		{state: idem.StateFailed, lastErr: "x", expiresAt: -1},
		{state: idem.StateReleased},
	}
	for _, r := range tests {
		key := []byte("k\x00\xff")
		got, err := decode(key, r.encode(key))
		if err != nil {
			t.Fatal(err)
		}
		if got.state != r.state || got.token != r.token || got.attempts != r.attempts || got.ttl != r.ttl ||
			got.leaseUntil != r.leaseUntil || got.expiresAt != r.expiresAt || got.created != r.created ||
			got.updated != r.updated || !bytes.Equal(got.fp, r.fp) || !bytes.Equal(got.result, r.result) || got.lastErr != r.lastErr {
			t.Fatalf("round trip: %+v -> %+v", r, got)
		}
		if _, err := decode([]byte("other"), r.encode(key)); err == nil {
			t.Fatal("record accepted under another key")
		}
	}
}

// FuzzDecode: any bytes either decode to a record that re-encodes to the
// same bytes, or are refused; decode never panics.
func FuzzDecode(f *testing.F) {
	key := []byte("key")
	for _, r := range []rec{
		{state: idem.StateInProgress, token: 7, attempts: 1, leaseUntil: 1e18, expiresAt: 2e18},
		{state: idem.StateCompleted, token: 9, result: []byte("result"), fp: []byte("fp")},
	} {
		f.Add(key, r.encode(key))
	}
	f.Add(key, []byte{})
	f.Add(key, []byte{recordVersion, 9, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, key, v []byte) {
		r, err := decode(key, v)
		if err != nil {
			return
		}
		if !bytes.Equal(r.encode(key), v) {
			t.Fatalf("decode/encode differ for %x", v)
		}
	})
}
