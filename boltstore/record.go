package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/idem-dev/idem"
)

// recordVersion is the first byte of every stored record. A reader that meets
// another version refuses the record rather than guess its layout.
const recordVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt marks a record or index entry that fails its checks.
var errCorrupt = errors.New("corrupt")

// rec is the stored form of an idem.Record without its key (the bbolt key).
// Times are Unix nanoseconds; 0 is the zero time.
type rec struct {
	state      idem.State
	token      uint64
	attempts   uint64
	ttl        int64 // TTL of the latest claim: Complete and Fail retain for it
	leaseUntil int64
	expiresAt  int64
	created    int64
	updated    int64
	fp         []byte
	result     []byte
	lastErr    string
}

// encode lays the record of key out as: version, state, uvarint token, uvarint
// attempts, varint ttl/leaseUntil/expiresAt/created/updated, then
// length-prefixed fingerprint, last error and result, and a CRC-32C of all of
// it and of the key. bbolt checksums only its meta pages; the CRC makes a
// flipped bit in a data page (in the value or in the key it is filed under)
// an error instead of a silently different record.
func (r *rec) encode(key []byte) []byte {
	b := make([]byte, 0, 2+5*binary.MaxVarintLen64+2*binary.MaxVarintLen64+3*binary.MaxVarintLen32+len(r.fp)+len(r.result)+len(r.lastErr)+4)
	b = append(b, recordVersion, byte(r.state))
	b = binary.AppendUvarint(b, r.token)
	b = binary.AppendUvarint(b, r.attempts)
	for _, v := range [...]int64{r.ttl, r.leaseUntil, r.expiresAt, r.created, r.updated} {
		b = binary.AppendVarint(b, v)
	}
	b = binary.AppendUvarint(b, uint64(len(r.fp)))
	b = append(b, r.fp...)
	b = binary.AppendUvarint(b, uint64(len(r.lastErr)))
	b = append(b, r.lastErr...)
	b = binary.AppendUvarint(b, uint64(len(r.result)))
	b = append(b, r.result...)
	return binary.LittleEndian.AppendUint32(b, crc32.Update(crc32.Checksum(b, castagnoli), castagnoli, key))
}

// decode parses the stored record of key, copying every slice out of v (bbolt memory
// is only valid inside the transaction).
func decode(key, v []byte) (rec, error) {
	var r rec
	if len(v) < 2+4 {
		return r, fmt.Errorf("%w: record of %d bytes", errCorrupt, len(v))
	}
	body, sum := v[:len(v)-4], binary.LittleEndian.Uint32(v[len(v)-4:])
	if crc32.Update(crc32.Checksum(body, castagnoli), castagnoli, key) != sum {
		return r, fmt.Errorf("%w: record checksum mismatch", errCorrupt)
	}
	if body[0] != recordVersion {
		return r, fmt.Errorf("%w: record version %d, this build reads %d", errCorrupt, body[0], recordVersion)
	}
	r.state = idem.State(body[1])
	if r.state < idem.StateInProgress || r.state > idem.StateReleased {
		return r, fmt.Errorf("%w: record state %d", errCorrupt, body[1])
	}
	d := decoder{b: body[2:]}
	r.token = d.uvarint()
	r.attempts = d.uvarint()
	r.ttl = d.varint()
	r.leaseUntil = d.varint()
	r.expiresAt = d.varint()
	r.created = d.varint()
	r.updated = d.varint()
	r.fp = d.bytes()
	r.lastErr = string(d.bytes())
	r.result = d.bytes()
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return r, fmt.Errorf("%w: record: %v", errCorrupt, d.err)
	}
	return r, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errors.New("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d past the end", n)
		return nil
	}
	if n == 0 {
		return nil
	}
	out := append([]byte(nil), d.b[:n]...)
	d.b = d.b[n:]
	return out
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

func (r *rec) record(key []byte) idem.Record {
	return idem.Record{
		Key: clone(key), State: r.state, Token: r.token, Fingerprint: clone(r.fp), Result: clone(r.result),
		Attempts: int(r.attempts), LastError: r.lastErr, LeaseUntil: unixTime(r.leaseUntil),
		ExpiresAt: unixTime(r.expiresAt), CreatedAt: unixTime(r.created), UpdatedAt: unixTime(r.updated),
	}
}

// expiryKey is the expiry index key: big-endian expiresAt then the record key,
// so a cursor walks records in the order they expire.
func expiryKey(expiresAt int64, key []byte) []byte {
	k := make([]byte, 8+len(key))
	binary.BigEndian.PutUint64(k, uint64(expiresAt))
	copy(k[8:], key)
	return k
}

// progressKey is the in-progress index key: big-endian token then the record
// key. Tokens grow, so new claims append at the right edge of the index
// instead of dirtying a page per random key.
func progressKey(token uint64, key []byte) []byte {
	k := make([]byte, 8+len(key))
	binary.BigEndian.PutUint64(k, token)
	copy(k[8:], key)
	return k
}
