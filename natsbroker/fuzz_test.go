package natsbroker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FuzzParseVersion: any server-announced version string parses or is
// refused, never panics, and what parses prints back to an equal version.
func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"2.9.10", "v2.10.4", "2.11.0-RC.1", "2.15.3+build", "", "2..1", "-1.2.3", "99999999999999999999.0.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := parseVersion(s)
		if !ok {
			if atLeast(s, MinServerVersion) {
				t.Fatalf("unreadable version %q accepted", s)
			}
			return
		}
		again, ok := parseVersion(fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]))
		if !ok || again != v {
			t.Fatalf("%q -> %v -> %v", s, v, again)
		}
	})
}

// fakeMsg is a delivered JetStream message with arbitrary headers.
type fakeMsg struct {
	h    nats.Header
	subj string
	data []byte
}

func (m fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errors.New("no metadata") }
func (m fakeMsg) Data() []byte                              { return m.data }
func (m fakeMsg) Headers() nats.Header                      { return m.h }
func (m fakeMsg) Subject() string                           { return m.subj }
func (m fakeMsg) Reply() string                             { return "" }
func (m fakeMsg) Ack() error                                { return nil }
func (m fakeMsg) DoubleAck(context.Context) error           { return nil }
func (m fakeMsg) Nak() error                                { return nil }
func (m fakeMsg) NakWithDelay(time.Duration) error          { return nil }
func (m fakeMsg) InProgress() error                         { return nil }
func (m fakeMsg) Term() error                               { return nil }
func (m fakeMsg) TermWithReason(string) error               { return nil }

// FuzzConvert decodes arbitrary broker headers (Nats-Msg-Id, idem-message-id,
// idem-key in base64, anything else): the id comes from Nats-Msg-Id, else
// idem-message-id; a key that is not valid base64 is dropped, a valid one
// decoded byte for byte; every other header is kept as is.
func FuzzConvert(f *testing.F) {
	f.Add("msg-1", "", base64.StdEncoding.EncodeToString([]byte("k\x00\xff")), "x-a", "v")
	f.Add("", "msg-2", "not base64!", "traceparent", "00-bad")
	f.Add("", "", "", "", "")
	f.Add("\x00", "\xff\xfe", "====", "h\x00", "\x00")
	f.Fuzz(func(t *testing.T, natsID, idemID, key, name, value string) {
		h := nats.Header{}
		if natsID != "" {
			h[jetstream.MsgIDHeader] = []string{natsID}
		}
		if idemID != "" {
			h[broker.HeaderMessageID] = []string{idemID}
		}
		if key != "" {
			h[HeaderKey] = []string{key}
		}
		if name != "" && name != jetstream.MsgIDHeader && name != broker.HeaderMessageID && name != HeaderKey {
			h[name] = []string{value}
		}
		m := (&Subscriber{}).convert(fakeMsg{h: h, subj: "s", data: []byte("p")})
		wantID := natsID
		if wantID == "" {
			wantID = idemID
		}
		if m.ID != wantID {
			t.Fatalf("ID %q, want %q", m.ID, wantID)
		}
		if dec, err := base64.StdEncoding.DecodeString(key); key != "" && err == nil {
			if string(m.Key) != string(dec) {
				t.Fatalf("key %q decoded to %q, want %q", key, m.Key, dec)
			}
		} else if m.Key != nil {
			t.Fatalf("undecodable key %q gave %q", key, m.Key)
		}
		if _, ok := h[name]; ok && name != "" && name != jetstream.MsgIDHeader && name != HeaderKey && m.Headers[name] != h[name][0] {
			t.Fatalf("header %q = %q, want %q", name, m.Headers[name], h[name][0])
		}
		if m.Delivery != 1 || m.Topic != "s" || string(m.Payload) != "p" {
			t.Fatalf("message %+v", m)
		}
	})
}
