package kafkabroker

import (
	"fmt"
	"testing"

	"github.com/idem-dev/idem/broker"
	"github.com/twmb/franz-go/pkg/kgo"
)

// FuzzMessage decodes arbitrary record headers into a delivery: the id
// comes from the idem-message-id header, else from the record's stable
// coordinates (never empty); every other header is kept byte for byte
// (the last of repeated names wins); key and payload pass through.
func FuzzMessage(f *testing.F) {
	f.Add([]byte("msg-1"), true, "x-a", []byte("v"), []byte("k"), []byte("p"), int64(7))
	f.Add([]byte(""), true, "traceparent", []byte("00-bad"), []byte(nil), []byte(nil), int64(0))
	f.Add([]byte("\x00\xff"), false, "", []byte("\xfe"), []byte("\x00"), []byte("{}"), int64(-1))
	f.Fuzz(func(t *testing.T, id []byte, hasID bool, name string, value, key, payload []byte, off int64) {
		r := &kgo.Record{Topic: "t", Partition: 3, Offset: off, Key: key, Value: payload}
		if hasID {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: broker.HeaderMessageID, Value: id})
		}
		if name != broker.HeaderMessageID {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: name, Value: value})
		}
		m := (&Subscriber{}).message(&partition{t: newTracker()}, &entry{deliveries: 1}, r)
		want := string(id)
		if !hasID || len(id) == 0 {
			want = fmt.Sprintf("kafka:t:3:%d", off)
		}
		if m.ID != want {
			t.Fatalf("ID %q, want %q", m.ID, want)
		}
		if name != broker.HeaderMessageID && m.Headers[name] != string(value) {
			t.Fatalf("header %q = %q, want %q", name, m.Headers[name], value)
		}
		if _, ok := m.Headers[broker.HeaderMessageID]; ok {
			t.Fatal("the id header is left among the headers")
		}
		if string(m.Key) != string(key) || string(m.Payload) != string(payload) || m.Delivery != 1 {
			t.Fatalf("message %+v", m)
		}
	})
}
