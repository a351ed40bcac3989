package consumer_test

import (
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// TestFingerprintDocVectors: what docs/fingerprint.md tells a non-Go
// producer the consumer computes is what it computes.
func TestFingerprintDocVectors(t *testing.T) {
	doc, err := os.ReadFile("../docs/fingerprint.md")
	if err != nil {
		t.Fatal(err)
	}
	m := &broker.Message{Payload: []byte(`{"order":42,"amount":"9.99"}`)}
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"PayloadFingerprint", consumer.PayloadFingerprint(m), "a59f9bf4dcb558f05c28c48f87e58d7f1160274fc05785949310f418e7fc9b7f"},
		{"JSONFieldsFingerprint", consumer.JSONFieldsFingerprint("order", "amount")(m), "2a0b82373d8ab42f1f34dc3a724d041cb59d115bb14fb51e158d71a2dc15e822"},
	} {
		if hex.EncodeToString(tc.got) != tc.want {
			t.Errorf("%s = %x, want %s", tc.name, tc.got, tc.want)
		}
		if !strings.Contains(string(doc), "| "+tc.want+" |") {
			t.Errorf("docs/fingerprint.md has no vector row %s (%s)", tc.want, tc.name)
		}
	}
}
