package watermillidem

import (
	"encoding/binary"
	"errors"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The record's result holds the messages the handler produced, so a
// duplicate can return them again (replay). Format: a version byte (1), the
// message count, then per message its UUID, its metadata (count, then key
// and value, sorted by key) and its payload; every count and length is an
// unsigned varint, every string is raw bytes. No produced messages: an
// empty result.
const resultVersion = 1

var errBadResult = errors.New("watermillidem: stored result is not a list of messages")

func encodeResult(msgs []*message.Message) []byte {
	if len(msgs) == 0 {
		return nil
	}
	b := []byte{resultVersion}
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	str := func(s []byte) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, m := range msgs {
		str([]byte(m.UUID))
		keys := make([]string, 0, len(m.Metadata))
		for k := range m.Metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			str([]byte(k))
			str([]byte(m.Metadata[k]))
		}
		str(m.Payload)
	}
	return b
}

func decodeResult(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != resultVersion {
		return nil, errBadResult
	}
	b = b[1:]
	uv := func() (uint64, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, false
		}
		b = b[k:]
		return n, true
	}
	str := func() ([]byte, bool) {
		n, ok := uv()
		if !ok || n > uint64(len(b)) {
			return nil, false
		}
		s := b[:n:n]
		b = b[n:]
		return s, true
	}
	count, ok := uv()
	// Each message takes at least 3 bytes: a bound before allocating.
	if !ok || count > uint64(len(b))/3+1 {
		return nil, errBadResult
	}
	out := make([]*message.Message, 0, count)
	for range count {
		id, ok := str()
		if !ok {
			return nil, errBadResult
		}
		nmeta, ok := uv()
		if !ok || nmeta > uint64(len(b))/2 {
			return nil, errBadResult
		}
		m := message.NewMessage(string(id), nil)
		for range nmeta {
			k, ok1 := str()
			v, ok2 := str()
			if !ok1 || !ok2 {
				return nil, errBadResult
			}
			m.Metadata.Set(string(k), string(v))
		}
		p, ok := str()
		if !ok {
			return nil, errBadResult
		}
		m.Payload = slices.Clone(p)
		out = append(out, m)
	}
	if len(b) != 0 {
		return nil, errBadResult
	}
	return out, nil
}
