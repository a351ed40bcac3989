package watermillidem

import (
	"bytes"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// FuzzDecodeResult: decoding any bytes never panics or allocates without
// bound, and what decodes survives an encode/decode round trip unchanged
// (byte equality is too strong: varints have overlong forms).
func FuzzDecodeResult(f *testing.F) {
	a := message.NewMessage("out-1", []byte("payload"))
	a.Metadata.Set("k", "v")
	a.Metadata.Set("a", "")
	f.Add(encodeResult([]*message.Message{a, message.NewMessage("", nil)}))
	f.Add([]byte{})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := decodeResult(b)
		if err != nil {
			return
		}
		again, err := decodeResult(encodeResult(msgs))
		if err != nil || len(again) != len(msgs) {
			t.Fatalf("decode(%x) = %d messages; after a round trip %d, %v", b, len(msgs), len(again), err)
		}
		for i := range msgs {
			if !again[i].Equals(msgs[i]) || !bytes.Equal(again[i].Payload, msgs[i].Payload) {
				t.Fatalf("decode(%x): message %d changed in a round trip", b, i)
			}
		}
	})
}

func TestResultRoundTrip(t *testing.T) {
	a := message.NewMessage("out-1", []byte("payload"))
	a.Metadata.Set("k", "v")
	b := message.NewMessage("out-2", nil)
	got, err := decodeResult(encodeResult([]*message.Message{a, b}))
	if err != nil || len(got) != 2 || !got[0].Equals(a) || got[1].UUID != "out-2" || len(got[1].Payload) != 0 {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	if got, err := decodeResult(nil); err != nil || got != nil {
		t.Fatalf("empty result: %v, %v", got, err)
	}
	if _, err := decodeResult([]byte{2}); err == nil {
		t.Fatal("unknown version decoded")
	}
}
