package idem_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// docVectors reads the test vectors of docs/fingerprint.md: parts and the
// fingerprint, both hex.
func docVectors(t *testing.T, path string) (parts [][][]byte, want [][]byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "<!-- vectors"):
			in = true
			continue
		case strings.HasPrefix(line, "<!-- /vectors"):
			in = false
		}
		if !in || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| parts") || strings.HasPrefix(line, "| ---") {
			continue
		}
		cols := strings.Split(line, "|")
		if len(cols) < 4 {
			t.Fatalf("bad vector row %q", line)
		}
		p, w := strings.TrimSpace(cols[1]), strings.TrimSpace(cols[2])
		var ps [][]byte
		switch p {
		case "-":
		case "(empty)":
			ps = [][]byte{{}}
		default:
			for _, h := range strings.Split(p, ",") {
				x, err := hex.DecodeString(h)
				if err != nil {
					t.Fatalf("row %q: %v", line, err)
				}
				ps = append(ps, x)
			}
		}
		wb, err := hex.DecodeString(w)
		if err != nil || len(wb) != 32 {
			t.Fatalf("row %q: fingerprint %v", line, err)
		}
		parts, want = append(parts, ps), append(want, wb)
	}
	if len(want) < 5 {
		t.Fatalf("%s: only %d vectors found", path, len(want))
	}
	return parts, want
}

// TestFingerprintVectors checks the wire format documented for non-Go
// producers (docs/fingerprint.md) against FingerprintOf.
func TestFingerprintVectors(t *testing.T) {
	parts, want := docVectors(t, "docs/fingerprint.md")
	for i := range want {
		if got := idem.FingerprintOf(parts[i]...); !bytes.Equal(got, want[i]) {
			t.Errorf("vector %d: FingerprintOf(%x) = %x, docs say %x", i, parts[i], got, want[i])
		}
	}
}
