package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// Message is what a producer writes into the outbox inside its business
// transaction, and what the relay publishes.
type Message struct {
	// ID is fixed before the first send and kept across every retry: the
	// broker's dedup id (Nats-Msg-Id, the idem-message-id header) and the
	// consumer's idempotency key. Empty: the backend's NewID makes one (a
	// snowflake id by default where configured). Text: valid UTF-8
	// without NUL, at most MaxIDLen bytes.
	ID      string
	Topic   string            // required
	Key     []byte            // partition / ordering key; may be empty
	Headers map[string]string // may be nil; trace context is added from the context
	Payload []byte
}

// Limits, checked before any I/O.
const (
	MaxIDLen      = 128
	MaxTopicLen   = 255
	MaxKeyLen     = 512
	MaxHeadersLen = 64 << 10 // encoded
	MaxPayloadLen = 4 << 20
	MaxErrorLen   = 1024 // last_error is truncated to this
)

// Status is a stored message's state. The numbers are the seed's
// message_send_log.status values and what the tables store.
type Status uint8

const (
	StatusPending Status = 0 // waiting to be published (now or at NextAttemptAt)
	StatusSent    Status = 1 // published; kept until retention removes it
	StatusFailed  Status = 2 // attempts exhausted; kept until re-queued
)

func (s Status) String() string {
	switch s {
	case StatusPending:
		return "pending"
	case StatusSent:
		return "sent"
	case StatusFailed:
		return "failed"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Row is a stored message.
type Row struct {
	Message
	// Seq is the backend's insertion sequence: a key's messages are
	// published in Seq order when the relay keeps per-key order. It is
	// NOT a cursor: rows commit out of Seq order.
	Seq           int64
	Status        Status
	Attempts      int // publish attempts so far
	NextAttemptAt time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
	LastError     string
	// Bad, when set, says why the stored row cannot be published as it
	// is (headers that do not decode: a row written by another program,
	// or damaged). The backend returns such a row rather than failing
	// the claim; the relay marks it failed at once.
	Bad string
}

// Errors of outbox backends, besides idem.ErrInvalidArgument (a message
// or argument out of range, before any I/O), idem.ErrUnavailable and
// idem.ErrUnknownOutcome.
var (
	// ErrDuplicateID: a message with this ID is already in the outbox (in
	// any state). Enqueue fails; PostgreSQL then aborts the caller's
	// transaction (roll it back), MariaDB and bbolt only drop the call's
	// messages.
	ErrDuplicateID = errors.New("outbox: duplicate message id")
	// ErrBatchEnded: Settle on a batch already settled or released.
	ErrBatchEnded = errors.New("outbox: batch already ended")
)

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: outbox: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
}

// Prepare is what every backend's Enqueue does before writing: it fills an
// empty ID from newID (an error when newID is nil), adds the trace context
// of ctx (broker.TraceFromContext) as headers unless the message has its
// own traceparent, validates the limits, and encodes the headers
// (EncodeHeaders). m itself is not modified.
func Prepare(ctx context.Context, m Message, newID func() (string, error)) (Message, []byte, error) {
	if m.ID == "" {
		if newID == nil {
			return m, nil, invalid("message has no ID and the outbox has no NewID")
		}
		id, err := newID()
		if err != nil {
			return m, nil, fmt.Errorf("outbox: new message id: %w", err)
		}
		m.ID = id
	}
	if t, ok := broker.TraceFromContext(ctx); ok && broker.ValidTraceParent(t.TraceParent) && m.Headers[broker.HeaderTraceParent] == "" {
		h := make(map[string]string, len(m.Headers)+2)
		for k, v := range m.Headers {
			h[k] = v
		}
		h[broker.HeaderTraceParent] = t.TraceParent
		if t.TraceState != "" {
			h[broker.HeaderTraceState] = t.TraceState
		}
		m.Headers = h
	}
	if err := Validate(m); err != nil {
		return m, nil, err
	}
	hdr := EncodeHeaders(m.Headers)
	if len(hdr) > MaxHeadersLen {
		return m, nil, invalid("message %q: headers encode to %d bytes, the limit is %d", m.ID, len(hdr), MaxHeadersLen)
	}
	return m, hdr, nil
}

// Validate checks a message against the limits (ID set). The ID and the
// topic are text: a PostgreSQL text column, a header value, a subject; NUL
// and invalid UTF-8 are refused in them (keys, header and payload bytes
// are free).
func Validate(m Message) error {
	switch {
	case m.ID == "" || len(m.ID) > MaxIDLen:
		return invalid("message id must be 1 to %d bytes, got %d", MaxIDLen, len(m.ID))
	case !isText(m.ID):
		return invalid("message id %q: NUL or invalid UTF-8", m.ID)
	case m.Topic == "" || len(m.Topic) > MaxTopicLen:
		return invalid("message %q: topic must be 1 to %d bytes, got %d", m.ID, MaxTopicLen, len(m.Topic))
	case !isText(m.Topic):
		return invalid("message %q: topic %q: NUL or invalid UTF-8", m.ID, m.Topic)
	case len(m.Key) > MaxKeyLen:
		return invalid("message %q: key is %d bytes, the limit is %d", m.ID, len(m.Key), MaxKeyLen)
	case len(m.Payload) > MaxPayloadLen:
		return invalid("message %q: payload is %d bytes, the limit is %d", m.ID, len(m.Payload), MaxPayloadLen)
	}
	return nil
}

func isText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// EncodeHeaders encodes headers losslessly (any bytes in names and values):
// a uvarint count, then for each header in name order a uvarint length and
// the name, a uvarint length and the value. Nil and empty maps encode to
// nil.
func EncodeHeaders(h map[string]string) []byte {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	n := binary.MaxVarintLen64
	for k, v := range h {
		keys = append(keys, k)
		n += 2*binary.MaxVarintLen64 + len(k) + len(v)
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(h)))
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(h[k])))
		b = append(b, h[k]...)
	}
	return b
}

// DecodeHeaders is the inverse of EncodeHeaders; empty input decodes to
// nil. A malformed encoding is an error, never a panic.
func DecodeHeaders(b []byte) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	bad := func() (map[string]string, error) { return nil, errors.New("outbox: malformed headers encoding") }
	count, n := binary.Uvarint(b)
	if n <= 0 || count == 0 || count > uint64(len(b)) {
		return bad()
	}
	b = b[n:]
	h := make(map[string]string, count)
	str := func() (string, bool) {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return "", false
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		return s, true
	}
	for i := uint64(0); i < count; i++ {
		k, ok := str()
		if !ok {
			return bad()
		}
		v, ok := str()
		if !ok {
			return bad()
		}
		if _, dup := h[k]; dup {
			return bad()
		}
		h[k] = v
	}
	if len(b) != 0 {
		return bad()
	}
	return h, nil
}

// TruncateError makes a publish error's text fit last_error: invalid UTF-8
// and NUL bytes (a broker client may quote a key or payload; a PostgreSQL
// text column refuses both) become U+FFFD, and the result is cut to
// MaxErrorLen bytes on a rune boundary. Backends store what it returns, so
// no error text can fail a settlement.
func TruncateError(s string) string {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	if len(s) <= MaxErrorLen {
		return s
	}
	i := MaxErrorLen
	for i > 0 && s[i]&0xC0 == 0x80 {
		i--
	}
	return s[:i]
}
