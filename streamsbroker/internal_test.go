package streamsbroker

import (
	"bytes"
	"maps"
	"testing"

	"github.com/idem-dev/idem/broker"
)

func TestSlotPrefix(t *testing.T) {
	for _, tc := range []struct {
		stream, want string
		ok           bool
	}{
		{"orders", "{orders}", true},
		{"a:b:c", "{a:b:c}", true},
		{"{tenant1}.orders", "{tenant1}.orders", true},
		{"x{t}y{u}", "x{t}y{u}", true},
		{"", "", false},
		{"a{b", "", false},     // no closing brace: no tag, and {a{b} would hash "a{b" only by luck
		{"a{}b", "", false},    // empty tag: the whole name is hashed
		{"a}b", "", false},     // {a}b} would hash "a"
		{"a{}b{c}", "", false}, // the first '{' decides: empty tag
	} {
		got, err := slotPrefix(tc.stream)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("slotPrefix(%q) = %q, %v; want %q, ok %v", tc.stream, got, err, tc.want, tc.ok)
		}
		if tc.ok && hashTag(got+":suffix") != hashTag(tc.stream) {
			t.Errorf("%q: a suffixed key hashes %q, the stream %q", tc.stream, hashTag(got+":suffix"), hashTag(tc.stream))
		}
	}
}

// hashTag is the part of key Redis Cluster hashes (its key slot rule).
func hashTag(key string) string {
	if i := bytes.IndexByte([]byte(key), '{'); i >= 0 {
		if j := bytes.IndexByte([]byte(key[i+1:]), '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// FuzzFieldsRoundTrip: what the publisher writes decodes to the same
// message (id, key, nil vs empty key, payload, headers), whatever the bytes.
func FuzzFieldsRoundTrip(f *testing.F) {
	f.Add("id-1", []byte("k"), false, []byte(`{"n":1}`), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("", []byte{}, true, []byte{}, "", "")
	f.Add("\x00\xff", []byte{0, 1, 2}, false, []byte("\r\n"), "h:nested", "payload")
	f.Fuzz(func(t *testing.T, id string, key []byte, nilKey bool, payload []byte, hk, hv string) {
		if id == "" {
			id = "x"
		}
		if nilKey {
			key = nil
		} else if key == nil {
			key = []byte{}
		}
		m := &broker.Message{ID: id, Topic: "s", Key: key, Payload: payload, Headers: map[string]string{hk: hv}}
		args := encode(m)
		fields := make([]string, len(args))
		for i, a := range args {
			switch v := a.(type) {
			case string:
				fields[i] = v
			case []byte:
				fields[i] = string(v)
			}
		}
		got := decode("s", "1700000000000-0", fields, 3)
		if got.ID != id || (got.Key == nil) != (key == nil) || !bytes.Equal(got.Key, key) || !bytes.Equal(got.Payload, payload) ||
			!maps.Equal(got.Headers, m.Headers) || got.Delivery != 3 || got.PublishedAt.UnixMilli() != 1700000000000 {
			t.Fatalf("round trip of %+v gave %+v", m, got)
		}
	})
}
