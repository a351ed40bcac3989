package boltoutbox

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/idem-dev/idem/outbox"
)

// row is a stored message. Times are Unix nanoseconds on Config.Clock.
type row struct {
	status                 outbox.Status
	attempts               uint64
	next, created, updated int64
	id, topic, key         []byte
	headers, payload       []byte
	lastErr                []byte
}

const rowFormat = 1

// encode: format byte, status byte, uvarint attempts, varint next, created,
// updated, then id, topic, key, headers, payload, last error, each as a
// uvarint length and the bytes.
func (r *row) encode() []byte {
	n := 2 + 4*binary.MaxVarintLen64 + 6*binary.MaxVarintLen32 +
		len(r.id) + len(r.topic) + len(r.key) + len(r.headers) + len(r.payload) + len(r.lastErr)
	b := make([]byte, 0, n)
	b = append(b, rowFormat, byte(r.status))
	b = binary.AppendUvarint(b, r.attempts)
	b = binary.AppendVarint(b, r.next)
	b = binary.AppendVarint(b, r.created)
	b = binary.AppendVarint(b, r.updated)
	for _, f := range [][]byte{r.id, r.topic, r.key, r.headers, r.payload, r.lastErr} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return b
}

var errCorrupt = errors.New("malformed outbox row")

// decodeRow is the inverse of encode; it copies nothing out of b except
// into fresh slices (b belongs to a bbolt transaction).
func decodeRow(b []byte) (*row, error) {
	if len(b) < 2 || b[0] != rowFormat || b[1] > byte(outbox.StatusFailed) {
		return nil, errCorrupt
	}
	r := &row{status: outbox.Status(b[1])}
	b = b[2:]
	var n int
	if r.attempts, n = binary.Uvarint(b); n <= 0 {
		return nil, errCorrupt
	}
	b = b[n:]
	for _, p := range []*int64{&r.next, &r.created, &r.updated} {
		if *p, n = binary.Varint(b); n <= 0 {
			return nil, errCorrupt
		}
		b = b[n:]
	}
	for _, p := range []*[]byte{&r.id, &r.topic, &r.key, &r.headers, &r.payload, &r.lastErr} {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return nil, errCorrupt
		}
		if l > 0 {
			*p = append([]byte(nil), b[n:n+int(l)]...)
		}
		b = b[n+int(l):]
	}
	if len(b) != 0 {
		return nil, errCorrupt
	}
	return r, nil
}

func (r *row) outboxRow(seq uint64) outbox.Row {
	h, err := outbox.DecodeHeaders(r.headers) // written by Prepare's encoder, unless damaged
	bad := ""
	if err != nil {
		bad = err.Error() // the relay fails it
	}
	return outbox.Row{
		Bad:     bad,
		Message: outbox.Message{ID: string(r.id), Topic: string(r.topic), Key: r.key, Headers: h, Payload: r.payload},
		Seq:     int64(seq), Status: r.status, Attempts: int(r.attempts),
		NextAttemptAt: time.Unix(0, r.next), CreatedAt: time.Unix(0, r.created), UpdatedAt: time.Unix(0, r.updated),
		LastError: string(r.lastErr),
	}
}
