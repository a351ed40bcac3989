// Package keytime reads the time a key carries (UUIDv7, ULID, Snowflake
// IDs). The SQL stores' time-ordered and time-partitioned layouts index on
// (key time, key hash): because the time is a pure function of the key, that
// pair is exactly as unique as the key, and inserts land at the index's
// right edge instead of on random pages.
package keytime

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
)

// Func returns the time a key carries. It must be a pure function of
// the key: the (key_time, key_hash) pair is then as unique as the key itself.
// An error becomes ErrInvalidKey before any SQL runs.
type Func func(key []byte) (time.Time, error)

func keyTimeErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{idem.ErrInvalidKey}, a...)...)
}

// UUIDv7 reads the 48-bit Unix millisecond prefix of a UUIDv7 key,
// given as 16 raw bytes or as 36-byte canonical text (case-insensitive).
func UUIDv7(key []byte) (time.Time, error) {
	var b [16]byte
	switch len(key) {
	case 16:
		copy(b[:], key)
	case 36:
		if key[8] != '-' || key[13] != '-' || key[18] != '-' || key[23] != '-' {
			return time.Time{}, keyTimeErr("not a UUID: %q", key)
		}
		h := make([]byte, 0, 32)
		h = append(h, key[0:8]...)
		h = append(h, key[9:13]...)
		h = append(h, key[14:18]...)
		h = append(h, key[19:23]...)
		h = append(h, key[24:36]...)
		if _, err := hex.Decode(b[:], h); err != nil {
			return time.Time{}, keyTimeErr("not a UUID: %q", key)
		}
	default:
		return time.Time{}, keyTimeErr("UUIDv7 key must be 16 bytes or 36 characters, got %d", len(key))
	}
	if b[6]>>4 != 7 {
		return time.Time{}, keyTimeErr("UUID version %d, want 7", b[6]>>4)
	}
	ms := int64(b[0])<<40 | int64(b[1])<<32 | int64(b[2])<<24 | int64(b[3])<<16 | int64(b[4])<<8 | int64(b[5])
	return time.UnixMilli(ms).UTC(), nil
}

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

var crockfordVal = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for i := 0; i < len(crockford); i++ {
		c := crockford[i]
		t[c] = int8(i)
		if c >= 'A' && c <= 'Z' {
			t[c+'a'-'A'] = int8(i)
		}
	}
	return t
}()

// ULID reads the 48-bit millisecond time of a 26-character ULID
// (Crockford base32, case-insensitive).
func ULID(key []byte) (time.Time, error) {
	if len(key) != 26 {
		return time.Time{}, keyTimeErr("ULID key must be 26 characters, got %d", len(key))
	}
	if crockfordVal[key[0]] < 0 || crockfordVal[key[0]] > 7 {
		return time.Time{}, keyTimeErr("not a ULID: %q", key)
	}
	var ms int64
	for _, c := range key[:10] {
		v := crockfordVal[c]
		if v < 0 {
			return time.Time{}, keyTimeErr("not a ULID: %q", key)
		}
		ms = ms<<5 | int64(v)
	}
	for _, c := range key[10:] {
		if crockfordVal[c] < 0 {
			return time.Time{}, keyTimeErr("not a ULID: %q", key)
		}
	}
	return time.UnixMilli(ms).UTC(), nil
}

// Snowflake returns a Func for Snowflake IDs (41-bit
// millisecond time above 22 low bits) counted from epoch, given as decimal
// text or 8 big-endian bytes. It is SnowflakeBits(epoch, 22): the default
// layout of package snowflake and Twitter's.
func Snowflake(epoch time.Time) Func { return SnowflakeBits(epoch, 22) }

// SnowflakeBits returns a Func for 63-bit Snowflake-style IDs whose
// millisecond time since epoch sits above lowBits bits of worker and
// sequence (package snowflake's Layout.KeyTime uses it). IDs are given as
// decimal text without leading zeros or as 8 big-endian bytes. lowBits must
// be in [0, 62]; outside it every key is rejected.
func SnowflakeBits(epoch time.Time, lowBits uint) Func {
	return func(key []byte) (time.Time, error) {
		if lowBits > 62 {
			return time.Time{}, keyTimeErr("snowflake layout with %d low bits", lowBits)
		}
		var id uint64
		if len(key) == 8 {
			id = binary.BigEndian.Uint64(key)
		} else {
			v, err := strconv.ParseUint(string(key), 10, 63)
			if err != nil || len(key) > 1 && key[0] == '0' {
				return time.Time{}, keyTimeErr("not a Snowflake ID: %q", key)
			}
			id = v
		}
		if id>>63 != 0 {
			return time.Time{}, keyTimeErr("snowflake ID %d has the sign bit set", id)
		}
		ms := id >> lowBits
		if ms > uint64(math.MaxInt64/int64(time.Millisecond)) {
			return time.Time{}, keyTimeErr("snowflake ID %d: time out of range for %d low bits", id, lowBits)
		}
		return epoch.Add(time.Duration(ms) * time.Millisecond).UTC(), nil
	}
}
