package idem_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  []byte
		err  error
	}{
		{"nil", nil, idem.ErrInvalidKey},
		{"empty", []byte{}, idem.ErrInvalidKey},
		{"one byte", []byte("a"), nil},
		{"NUL", []byte{0}, nil},
		{"invalid UTF-8", []byte{0xff, 0xfe}, nil},
		{"at the limit", bytes.Repeat([]byte("k"), idem.MaxKeyLen), nil},
		{"over the limit", bytes.Repeat([]byte("k"), idem.MaxKeyLen+1), idem.ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := idem.ValidateKey(tc.key); !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("ValidateKey = %v, want %v", err, tc.err)
			}
		})
	}
}

func TestValidateClaimAndNamespace(t *testing.T) {
	ok := idem.ClaimRequest{Key: []byte("k"), Lease: time.Second, TTL: time.Hour}
	for _, tc := range []struct {
		name string
		mod  func(*idem.ClaimRequest)
		err  error
	}{
		{"valid", func(*idem.ClaimRequest) {}, nil},
		{"min lease", func(r *idem.ClaimRequest) { r.Lease = idem.MinDuration }, nil},
		{"sub-ms lease", func(r *idem.ClaimRequest) { r.Lease = time.Microsecond }, idem.ErrInvalidArgument},
		{"max lease", func(r *idem.ClaimRequest) { r.Lease = idem.MaxLease }, nil},
		{"lease over max", func(r *idem.ClaimRequest) { r.Lease = idem.MaxLease + 1 }, idem.ErrInvalidArgument},
		{"negative ttl", func(r *idem.ClaimRequest) { r.TTL = -time.Hour }, idem.ErrInvalidArgument},
		{"ttl over max", func(r *idem.ClaimRequest) { r.TTL = idem.MaxTTL + 1 }, idem.ErrInvalidArgument},
		{"fingerprint at limit", func(r *idem.ClaimRequest) { r.Fingerprint = make([]byte, idem.MaxFingerprintLen) }, nil},
		{"fingerprint over", func(r *idem.ClaimRequest) { r.Fingerprint = make([]byte, idem.MaxFingerprintLen+1) }, idem.ErrInvalidArgument},
		{"empty key", func(r *idem.ClaimRequest) { r.Key = nil }, idem.ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mod(&r)
			if err := idem.ValidateClaim(r); !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("ValidateClaim = %v, want %v", err, tc.err)
			}
		})
	}
	for ns, valid := range map[string]bool{"": true, "payments": true, "a.b_c-9": true, "has space": false,
		"slash/": false, "colon:": false, "{tag}": false, strings.Repeat("n", idem.MaxNamespaceLen): true,
		strings.Repeat("n", idem.MaxNamespaceLen+1): false, "ü": false} {
		if err := idem.ValidateNamespace(ns); (err == nil) != valid {
			t.Errorf("ValidateNamespace(%q) = %v, want valid=%v", ns, err, valid)
		}
	}
	if got := idem.TruncateCause(strings.Repeat("x", 5000)); len(got) != idem.MaxCauseLen || idem.ValidateCause(got) != nil {
		t.Errorf("TruncateCause gave %d bytes", len(got))
	}
}

func TestFingerprintOf(t *testing.T) {
	a := idem.FingerprintOf([]byte("ab"), []byte("c"))
	b := idem.FingerprintOf([]byte("a"), []byte("bc"))
	if bytes.Equal(a, b) || len(a) != 32 || len(a) > idem.MaxFingerprintLen {
		t.Fatalf("fingerprints %x %x", a, b)
	}
	if !bytes.Equal(a, idem.FingerprintOf([]byte("ab"), []byte("c"))) {
		t.Fatal("not deterministic")
	}
}

// FuzzValidateKey: every key of 1..MaxKeyLen bytes is valid whatever its
// bytes; the error message never panics on binary keys.
func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"", "a", "\x00", "\xff\xfe", "a ", "é", strings.Repeat("k", idem.MaxKeyLen+1)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, key []byte) {
		err := idem.ValidateKey(key)
		valid := len(key) >= 1 && len(key) <= idem.MaxKeyLen
		if valid != (err == nil) {
			t.Fatalf("ValidateKey(%d bytes) = %v", len(key), err)
		}
		if err != nil && !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("error %v is not ErrInvalidKey", err)
		}
		if err != nil && !utf8.ValidString(err.Error()) {
			t.Fatalf("error message is not UTF-8")
		}
	})
}
