package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

var fuzzSeeds = []string{
	`{"key":"k"}`,
	`{"key":"a\u0000b","fingerprint":"f","lease_ms":1000,"ttl_ms":60000}`,
	`{"key_b64":"/wA=","fingerprint_b64":"AQID"}`,
	`{"key":"\ud83d\udd11"}`,
	`{"key":"\ud800"}`,
	`{"key":"k","key":"j"}`,
	`{"KEY":"k"}`,
	`{"key":"k","lease_ms":1.5}`,
	`{"key":"k","lease_ms":"100"}`,
	`{"key":"k","token":"18446744073709551615","result":"r"}`,
	`{"key":"k","token":1,"result_b64":"cg==","error":"e","lease_ms":5}`,
	`{"claims":[{"key":"a"},{"key_b64":"Yg=="}]}`,
	`{"claims":[]}`,
	`{"key":"k"} {}`,
	"{\"key\":\"\xff\"}",
	`[`, `{`, `{"key":`, `null`, ``,
}

// checkDecoded is what every accepted request must satisfy: what reaches
// the store is valid for it.
func checkDecoded(t *testing.T, c claimReq) {
	t.Helper()
	if err := idem.ValidateClaim(idem.ClaimRequest{Key: c.key, Fingerprint: c.fp, Lease: c.lease, TTL: c.ttl}); err != nil {
		t.Fatalf("accepted an invalid claim: %v", err)
	}
}

// reencode writes c back as JSON with base64 fields, which must decode to
// the same claim: the decoder loses or alters nothing.
func reencode(c claimReq) []byte {
	m := map[string]any{"key_b64": base64.StdEncoding.EncodeToString(c.key),
		"lease_ms": c.lease.Milliseconds(), "ttl_ms": c.ttl.Milliseconds()}
	if c.fp != nil {
		m["fingerprint_b64"] = base64.StdEncoding.EncodeToString(c.fp)
	}
	b, _ := json.Marshal(m)
	return b
}

func sameClaim(a, b claimReq) bool {
	return bytes.Equal(a.key, b.key) && bytes.Equal(a.fp, b.fp) && a.lease == b.lease && a.ttl == b.ttl
}

func wantBadRequest(t *testing.T, err error) {
	t.Helper()
	var br *badRequest
	if !errors.As(err, &br) || br.code == "" || br.detail == "" {
		t.Fatalf("error %v (%T) is not a 400 with code and detail", err, err)
	}
}

// FuzzDecode feeds arbitrary bodies to every request decoder: none panics,
// every rejection is a 400 with a code, and every accepted request is valid
// for the store and survives re-encoding unchanged.
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds {
		for op := range 6 {
			f.Add([]byte(s), uint8(op))
		}
	}
	defaults := claimReq{lease: idem.DefaultLease, ttl: idem.DefaultTTL}
	f.Fuzz(func(t *testing.T, body []byte, op uint8) {
		switch op % 6 {
		case 0:
			c, err := decodeClaim(body, defaults)
			if err != nil {
				wantBadRequest(t, err)
				return
			}
			checkDecoded(t, c)
			again, err := decodeClaim(reencode(c), claimReq{})
			if err != nil || !sameClaim(c, again) {
				t.Fatalf("re-encoded claim decodes to %+v, %v; want %+v", again, err, c)
			}
		case 1:
			cs, err := decodeBatch(body, defaults, 10)
			if err != nil {
				wantBadRequest(t, err)
				return
			}
			if len(cs) == 0 || len(cs) > 10 {
				t.Fatalf("batch of %d accepted", len(cs))
			}
			for _, c := range cs {
				checkDecoded(t, c)
			}
		default:
			s, err := decodeSettle(body, int(op%6-2))
			if err != nil {
				wantBadRequest(t, err)
				return
			}
			if err := idem.ValidateToken(s.key, s.token); err != nil {
				t.Fatalf("accepted an invalid key or token: %v", err)
			}
			if idem.ValidateResult(s.result) != nil || idem.ValidateCause(s.cause) != nil {
				t.Fatalf("accepted a result of %d or a cause of %d bytes", len(s.result), len(s.cause))
			}
			if int(op%6-2) == opExtend && idem.ValidateLease(s.lease) != nil {
				t.Fatalf("accepted lease %s", s.lease)
			}
		}
	})
}

// FuzzQueryKey: the records endpoints' query decoder.
func FuzzQueryKey(f *testing.F) {
	for _, s := range []string{"key=k", "key=a%00b", "key_b64=%2FwA%3D", "key=a&key=b", "key=", "key=%zz", "x=1", "key=a;b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		k, err := queryKey(q)
		if err != nil {
			wantBadRequest(t, err)
			return
		}
		if err := idem.ValidateKey(k); err != nil {
			t.Fatalf("accepted key %q: %v", k, err)
		}
	})
}

// FuzzTextKeyRoundTrip: any text key a client encodes as a JSON string
// arrives byte for byte, and any bytes arrive through key_b64.
func FuzzTextKeyRoundTrip(f *testing.F) {
	for _, s := range []string{"k", "a\x00b", "ключ", "\xff\xfe", "\"\\/\b\f\n\r\t", "\u2028\u2029", "<&>"} {
		f.Add([]byte(s), int64(1000))
	}
	f.Fuzz(func(t *testing.T, key []byte, lease int64) {
		body := fmt.Sprintf(`{"key_b64":%q,"lease_ms":%s}`, base64.StdEncoding.EncodeToString(key), strconv.FormatInt(lease, 10))
		c, err := decodeClaim([]byte(body), claimReq{ttl: time.Hour})
		valid := idem.ValidateKey(key) == nil && lease >= 1 && lease <= int64(idem.MaxLease/time.Millisecond)
		if valid != (err == nil) {
			t.Fatalf("key %q lease %d: err %v, want valid=%v", key, lease, err, valid)
		}
		if err == nil && !bytes.Equal(c.key, key) {
			t.Fatalf("key_b64 %q arrived as %q", key, c.key)
		}
		js, _ := json.Marshal(string(key)) // replaces invalid UTF-8: only text keys go this way
		if !utf8.Valid(key) || !valid {
			return
		}
		c, err = decodeClaim([]byte(`{"key":`+string(js)+`}`), claimReq{lease: time.Second, ttl: time.Hour})
		if err != nil || !bytes.Equal(c.key, key) {
			t.Fatalf("text key %q (%s) arrived as %q, %v", key, js, c.key, err)
		}
	})
}
