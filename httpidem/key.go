package httpidem

import (
	"errors"
	"strings"
)

// ParseKey reads an Idempotency-Key field value. The draft defines it as a
// Structured Field String (RFC 8941): printable ASCII in double quotes,
// with \" and \\ as the only escapes, e.g. "8e03978e-40d5-43e8-bc93-6894a57f9324".
// Many clients send the bare value (8e03978e-...) instead; that is accepted
// too when it is printable ASCII without spaces or quotes. Parameters
// (";x=y") are not accepted. The key is the string's content.
func ParseKey(v string) ([]byte, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return nil, errors.New("empty key")
	}
	if v[0] != '"' {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' || c == ';' || c == ',' {
				return nil, errors.New(`a key must be a quoted string ("...") or printable ASCII without spaces, quotes, backslashes, ';' or ','`)
			}
		}
		return []byte(v), nil
	}
	out := make([]byte, 0, len(v))
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return nil, errors.New(`in a quoted key only \" and \\ are escapes`)
			}
			out = append(out, v[i])
		case c == '"':
			if i != len(v)-1 {
				return nil, errors.New("text after the quoted key (parameters are not accepted)")
			}
			if len(out) == 0 {
				return nil, errors.New("empty key")
			}
			return out, nil
		case c < ' ' || c >= 0x7f:
			return nil, errors.New("a quoted key holds printable ASCII only")
		default:
			out = append(out, c)
		}
	}
	return nil, errors.New("unterminated quoted key")
}
