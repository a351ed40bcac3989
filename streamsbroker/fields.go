package streamsbroker

import (
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/broker"
)

// An entry's fields. The message id, key and payload have fields of their
// own; each header is a field named "h:" + its name. Values are raw bytes
// (Redis strings are binary-safe): keys and payloads are not encoded.
const (
	FieldID      = broker.HeaderMessageID // "idem-message-id"
	FieldKey     = "idem-key"             // present only when Message.Key is not nil
	FieldPayload = "payload"
	// FieldHeaderPrefix starts the field of each header.
	FieldHeaderPrefix = "h:"
)

// Fields the subscriber adds to an entry it moves to the dead-letter
// stream, beside the original fields.
const (
	FieldDeadLetterReason = "idem-dead-letter-reason"
	FieldDeadLetterStream = "idem-dead-letter-stream" // the stream it came from
	FieldDeadLetterEntry  = "idem-dead-letter-entry"  // its entry id there
)

// maxHeaders bounds the fields of one entry: the publish script passes them
// to XADD as arguments, and Lua's stack has a limit.
const maxHeaders = 1000

// encode returns m's fields as XADD arguments (name, value, name, value...).
func encode(m *broker.Message) []any {
	a := make([]any, 0, 6+2*len(m.Headers))
	a = append(a, FieldID, m.ID)
	if m.Key != nil {
		a = append(a, FieldKey, m.Key)
	}
	a = append(a, FieldPayload, m.Payload)
	for k, v := range m.Headers {
		a = append(a, FieldHeaderPrefix+k, v)
	}
	return a
}

// decode makes the delivery of entry id of stream from its fields (name,
// value pairs). Fields of another producer that are not idem's become
// headers under their own name. An entry without an id field gets
// "redis:<stream>:<entry id>": stable across its redeliveries, but two
// entries a foreign producer wrote for one event have two ids.
func decode(stream, id string, fields []string, delivery int) *broker.Message {
	m := &broker.Message{Topic: stream, Delivery: delivery, PublishedAt: entryTime(id), Payload: []byte{}}
	for i := 0; i+1 < len(fields); i += 2 {
		k, v := fields[i], fields[i+1]
		switch {
		case k == FieldID:
			m.ID = v
		case k == FieldKey:
			m.Key = []byte(v)
		case k == FieldPayload:
			m.Payload = []byte(v)
		default:
			if m.Headers == nil {
				m.Headers = make(map[string]string, len(fields)/2)
			}
			m.Headers[strings.TrimPrefix(k, FieldHeaderPrefix)] = v
		}
	}
	if m.ID == "" {
		m.ID = "redis:" + stream + ":" + id
	}
	return m
}

// entryTime is the time in an entry id ("<ms>-<seq>"), the server's clock
// when it was added; zero if id is not of that form.
func entryTime(id string) time.Time {
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		return time.Time{}
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}
