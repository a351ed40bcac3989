package keytime_test

import (
	"encoding/binary"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/keytime"
)

func TestKeyTime(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 34, 56, 789e6, time.UTC)
	epoch := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	sfID := uint64(at.Sub(epoch).Milliseconds())<<22 | 12345
	var sfBin [8]byte
	binary.BigEndian.PutUint64(sfBin[:], sfID)
	sf := keytime.Snowflake(epoch)
	sf18 := keytime.SnowflakeBits(epoch, 18) // e.g. 45 time bits, 8 worker, 10 sequence
	sf18ID := uint64(at.Sub(epoch).Milliseconds())<<18 | 0x3ffff
	cases := []struct {
		name string
		fn   keytime.Func
		key  string
		want time.Time // zero: must fail with ErrInvalidKey
	}{
		{"UUIDv7Binary", keytime.UUIDv7, string(uuid7(at, 9)), at},
		{"UUIDv7Text", keytime.UUIDv7, "019ad03b-2f55-7abc-8def-0123456789ab", time.UnixMilli(0x019ad03b2f55).UTC()},
		{"UUIDv7TextUpper", keytime.UUIDv7, "019AD03B-2F55-7ABC-8DEF-0123456789AB", time.UnixMilli(0x019ad03b2f55).UTC()},
		{"UUIDv4", keytime.UUIDv7, "019ad03b-2f55-4abc-8def-0123456789ab", time.Time{}},
		{"UUIDNoDashes", keytime.UUIDv7, "019ad03b2f557abc8def0123456789abcdef", time.Time{}},
		{"UUIDShort", keytime.UUIDv7, "abc", time.Time{}},
		{"ULID", keytime.ULID, "01ARZ3NDEKTSV4RRFFQ69G5FAV", time.UnixMilli(1469922850259).UTC()},
		{"ULIDLower", keytime.ULID, "01arz3ndektsv4rrffq69g5fav", time.UnixMilli(1469922850259).UTC()},
		{"ULIDOverflow", keytime.ULID, "81ARZ3NDEKTSV4RRFFQ69G5FAV", time.Time{}},
		{"ULIDBadChar", keytime.ULID, "01ARZ3NDEKTSV4RRFFQ69G5FAU", time.Time{}},
		{"ULIDShort", keytime.ULID, "01ARZ3", time.Time{}},
		{"SnowflakeText", sf, strconv.FormatUint(sfID, 10), at},
		{"SnowflakeBinary", sf, string(sfBin[:]), at},
		{"SnowflakeLeadingZero", sf, "0" + strconv.FormatUint(sfID, 10), time.Time{}},
		{"SnowflakeNotNumber", sf, "12ab", time.Time{}},
		{"SnowflakeBits18", sf18, strconv.FormatUint(sf18ID, 10), at},
		{"SnowflakeBits18Sign", sf18, "9223372036854775808", time.Time{}},
		{"SnowflakeBitsTooMany", keytime.SnowflakeBits(epoch, 63), "1", time.Time{}},
		{"SnowflakeBitsZeroOverflow", keytime.SnowflakeBits(epoch, 0), "9223372036854775807", time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fn([]byte(tc.key))
			if tc.want.IsZero() {
				if !errors.Is(err, idem.ErrInvalidKey) {
					t.Fatalf("got %v, %v; want ErrInvalidKey", got, err)
				}
				return
			}
			if err != nil || !got.Equal(tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzKeyTime: the extractors never panic, and either fail with
// ErrInvalidKey or return a time that is a pure function of the key.
func FuzzKeyTime(f *testing.F) {
	f.Add([]byte("01ARZ3NDEKTSV4RRFFQ69G5FAV"))
	f.Add([]byte("019ad03b-2f55-7abc-8def-0123456789ab"))
	f.Add(uuid7(time.Unix(1700000000, 0), 1))
	f.Add([]byte("1234567890123456789"))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1})
	fns := []keytime.Func{keytime.UUIDv7, keytime.ULID, keytime.Snowflake(time.Unix(0, 0)), keytime.SnowflakeBits(time.Unix(0, 0), 0)}
	f.Fuzz(func(t *testing.T, key []byte) {
		for _, fn := range fns {
			t1, err1 := fn(key)
			t2, err2 := fn(key)
			if err1 != nil && !errors.Is(err1, idem.ErrInvalidKey) {
				t.Fatalf("error %v does not match ErrInvalidKey", err1)
			}
			if (err1 == nil) != (err2 == nil) || !t1.Equal(t2) {
				t.Fatal("not a pure function of the key")
			}
		}
	})
}

// uuid7 makes a binary UUIDv7 key for time tm.
func uuid7(tm time.Time, seq byte) []byte {
	var b [16]byte
	ms := tm.UnixMilli()
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70
	b[8] = 0x80
	b[15] = seq
	return b[:]
}
