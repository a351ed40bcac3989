package mysqlstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Statements are sent as text with every value inlined as a hex or integer
// literal. Values are never spliced in as text, so nothing can inject SQL,
// and a call is one round trip whatever the DSN says (no prepare/execute
// pair, no dependency on interpolateParams).

// nowUS is the database clock in microseconds since the Unix epoch (UTC).
// UTC_TIMESTAMP(6) is fixed for the duration of one statement, so every use
// in a statement sees the same instant and the session time zone is irrelevant.
const nowUS = "TIMESTAMPDIFF(MICROSECOND,'1970-01-01 00:00:00',UTC_TIMESTAMP(6))"

// hexLit appends b as a binary string literal (X” for empty).
func hexLit(sb *strings.Builder, b []byte) {
	sb.WriteString("X'")
	var buf [256]byte
	for len(b) > 0 {
		n := min(len(b), len(buf)/2)
		hex.Encode(buf[:], b[:n])
		sb.Write(buf[:2*n])
		b = b[n:]
	}
	sb.WriteByte('\'')
}

func hexStr(b []byte) string {
	var sb strings.Builder
	sb.Grow(2*len(b) + 3)
	hexLit(&sb, b)
	return sb.String()
}

func intLit(sb *strings.Builder, v int64)   { sb.WriteString(strconv.FormatInt(v, 10)) }
func uintLit(sb *strings.Builder, v uint64) { sb.WriteString(strconv.FormatUint(v, 10)) }

// quoteIdent quotes a validated identifier.
func quoteIdent(s string) string { return "`" + s + "`" }

// keyHash is the first 16 bytes of SHA-256(key). The unique index holds the
// hash, not the key: MySQL/MariaDB collations would compare text keys
// case-insensitively and without trailing spaces, and a 1024-byte key makes
// a fat index. The raw key is stored beside it and compared on every read,
// so a (practically impossible) collision is detected rather than served.
func keyHash(key []byte) [16]byte {
	s := sha256.Sum256(key)
	var h [16]byte
	copy(h[:], s[:16])
	return h
}
