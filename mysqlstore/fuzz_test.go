package mysqlstore_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// Any key and fingerprint survive a claim/complete/get round trip through
// the server byte for byte, or are rejected before any SQL.
func FuzzKeyRoundTrip(f *testing.F) {
	for _, k := range [][]byte{[]byte("a"), []byte("A "), {0}, {0xff, 0xfe, 0}, []byte("ключ"), bytes.Repeat([]byte{'z'}, idem.MaxKeyLen), nil} {
		f.Add(k, []byte("fp"), []byte("result"))
	}
	s, _ := newStore(f, mysqlstore.Config{})
	f.Fuzz(func(t *testing.T, key, fp, result []byte) {
		ctx := testCtx(t)
		// The fuzzer repeats keys with other fingerprints: start each input
		// on an absent key (a claim of a repeated key with another
		// fingerprint is, rightly, ErrFingerprintMismatch).
		if idem.ValidateKey(key) == nil {
			if err := s.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
		if err != nil {
			if errors.Is(err, idem.ErrInvalidKey) || errors.Is(err, idem.ErrInvalidArgument) {
				return
			}
			t.Fatal(err)
		}
		if c.Outcome != idem.OutcomeAcquired {
			// The fuzzer may repeat a key: it must be ours from before.
			if err := s.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			if c, err = s.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}); err != nil || c.Outcome != idem.OutcomeAcquired {
				t.Fatalf("reclaim %q: %+v %v", key, c, err)
			}
		}
		if err := s.Complete(ctx, key, c.Record.Token, result); err != nil {
			if errors.Is(err, idem.ErrInvalidArgument) {
				return
			}
			t.Fatal(err)
		}
		rec, err := s.Get(ctx, key)
		if err != nil || !bytes.Equal(rec.Key, key) || !bytes.Equal(rec.Result, result) || !bytes.Equal(rec.Fingerprint, fp) {
			t.Fatalf("Get(%q) = %+v, %v", key, rec, err)
		}
	})
}
