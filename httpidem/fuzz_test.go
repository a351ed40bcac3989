package httpidem

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeResponse: a stored response, damaged in any way, is an error,
// never a panic; one that decodes encodes and decodes back the same.
func FuzzDecodeResponse(f *testing.F) {
	f.Add((&response{status: 201, header: http.Header{"Location": {"/o/1"}, "Set-Cookie": {"a=1", "b=2"}}, body: []byte("ok")}).encode())
	f.Add((&response{status: 204, header: http.Header{}}).encode())
	f.Add([]byte("IDH1\x00\xc8\x01\x01A\x01B"))
	f.Add([]byte("IDH1\x00\xc8\xff\xff\xff\xff\x0f"))
	f.Add([]byte("IDH0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		canon := http.Header{}
		for k, vs := range r.header {
			if notStored[http.CanonicalHeaderKey(k)] {
				continue
			}
			canon[http.CanonicalHeaderKey(k)] = append(canon[http.CanonicalHeaderKey(k)], vs...)
		}
		again, err := decodeResponse(r.encode())
		if err != nil {
			t.Fatalf("re-encoded response does not decode: %v", err)
		}
		if again.status != r.status || !bytes.Equal(again.body, r.body) || len(again.header) != len(canon) {
			t.Fatalf("round trip changed it: %+v -> %+v", r, again)
		}
	})
}

// FuzzResponseRoundTrip: any response the middleware captures comes back
// from the store as it was (minus the headers it never stores).
func FuzzResponseRoundTrip(f *testing.F) {
	f.Add(uint16(201), "Location", "/x", []byte("body"))
	f.Add(uint16(200), "Date", "now", []byte{})
	f.Add(uint16(999), "", "\x00", []byte{0xff})
	f.Fuzz(func(t *testing.T, status uint16, name, value string, body []byte) {
		if status < 100 || status > 999 || name == "" {
			return
		}
		in := response{status: int(status), header: http.Header{name: {value, value + "2"}}, body: body}
		out, err := decodeResponse(in.encode())
		if err != nil {
			t.Fatal(err)
		}
		want := http.Header{}
		if c := http.CanonicalHeaderKey(name); !notStored[c] {
			want[c] = []string{value, value + "2"}
		}
		if out.status != in.status || !bytes.Equal(out.body, body) || !reflect.DeepEqual(out.header, want) {
			t.Fatalf("%+v came back as %+v", in, out)
		}
	})
}

// FuzzParseKey: any header value is a key or an error; a key re-quoted
// parses to itself.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `""`, `"`, `"a";x`, "\x00", `"\\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := ParseKey(v)
		if err != nil {
			return
		}
		if len(k) == 0 {
			t.Fatal("empty key accepted")
		}
		for _, c := range k {
			if c < ' ' || c >= 0x7f {
				t.Fatalf("key %q holds a byte outside printable ASCII", k)
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(string(k)) + `"`
		if again, err := ParseKey(quoted); err != nil || !bytes.Equal(again, k) {
			t.Fatalf("%q -> %q -> %q, %v", v, k, again, err)
		}
	})
}
