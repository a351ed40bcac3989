package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

// badRequest is an input error: the answer is 400 with code and detail, and
// nothing reaches the store.
type badRequest struct {
	code   string
	detail string
}

func (e *badRequest) Error() string { return e.code + ": " + e.detail }

func invalid(format string, a ...any) error {
	return &badRequest{code: "invalid_request", detail: fmt.Sprintf(format, a...)}
}

func invalidKey(format string, a ...any) error {
	return &badRequest{code: "invalid_key", detail: fmt.Sprintf(format, a...)}
}

// checkText rejects a body that the JSON decoder would silently change:
// bytes that are not UTF-8 (encoding/json turns them into U+FFFD, so two
// different keys would become one) and \u escapes of lone UTF-16 surrogates
// (the same). Keys that are not Unicode text travel as key_b64.
func checkText(b []byte) error {
	if !utf8.Valid(b) {
		return &badRequest{code: "invalid_json", detail: "body is not valid UTF-8 (send bytes that are not text as key_b64 / result_b64)"}
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		// Outside a string a backslash is a syntax error the decoder reports;
		// inside one it starts an escape, whose next byte we skip.
		i++
		if i >= len(b) || b[i] != 'u' {
			continue
		}
		r, ok := hex4(b[i+1:])
		if !ok {
			continue // the decoder reports it
		}
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return &badRequest{code: "invalid_json", detail: fmt.Sprintf("lone UTF-16 surrogate \\u%04x in a string (use key_b64 for bytes that are not text)", r)}
		case r >= 0xD800 && r <= 0xDBFF:
			if len(b) < i+7 || b[i+1] != '\\' || b[i+2] != 'u' {
				return &badRequest{code: "invalid_json", detail: fmt.Sprintf("lone UTF-16 surrogate \\u%04x in a string (use key_b64 for bytes that are not text)", r)}
			}
			lo, ok := hex4(b[i+3:])
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return &badRequest{code: "invalid_json", detail: fmt.Sprintf("lone UTF-16 surrogate \\u%04x in a string (use key_b64 for bytes that are not text)", r)}
			}
			i += 6
		}
	}
	return nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// decoder reads one request body strictly: exactly one JSON object, member
// names matched exactly (encoding/json alone matches them case-insensitively
// and lets a repeated member silently win), no unknown or repeated
// members, no trailing data.
type decoder struct{ dec *json.Decoder }

func newDecoder(body []byte) (*decoder, error) {
	if err := checkText(body); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	return &decoder{dec: dec}, nil
}

func syntaxError(err error) error {
	if errors.Is(err, io.EOF) {
		return &badRequest{code: "invalid_json", detail: "empty body: want a JSON object"}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return &badRequest{code: "invalid_json", detail: "truncated JSON"}
	}
	return &badRequest{code: "invalid_json", detail: err.Error()}
}

// object reads an object whose members are names; member(i) reads the
// value of names[i] (with d.dec) and validates it.
func (d *decoder) object(what string, names []string, member func(i int) error) error {
	t, err := d.dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if t != json.Delim('{') {
		return &badRequest{code: "invalid_json", detail: what + " must be a JSON object"}
	}
	var seen uint64
	for d.dec.More() {
		t, err := d.dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		name, _ := t.(string)
		i := 0
		for i < len(names) && names[i] != name {
			i++
		}
		if i == len(names) {
			return invalid("%s: unknown field %q", what, name)
		}
		if seen&(1<<i) != 0 {
			return invalid("%s: field %q given twice", what, name)
		}
		seen |= 1 << i
		if err := member(i); err != nil {
			return err
		}
	}
	if _, err := d.dec.Token(); err != nil { // '}'
		return syntaxError(err)
	}
	return nil
}

// end checks that nothing follows the value read.
func (d *decoder) end() error {
	if _, err := d.dec.Token(); err != io.EOF {
		if err != nil {
			return syntaxError(err)
		}
		return &badRequest{code: "invalid_json", detail: "trailing data after the JSON object"}
	}
	return nil
}

// value decodes the next value into v, naming field in errors.
func (d *decoder) value(field string, v any) error {
	if err := d.dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			return invalid("%s: want a %s, got a JSON %s", field, kindOf(v), te.Value)
		case errors.As(err, &se), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return syntaxError(err)
		}
		return invalid("%s: want a %s: %v", field, kindOf(v), err)
	}
	return nil
}

func kindOf(v any) string {
	switch v.(type) {
	case **json.Number:
		return "number"
	}
	return "string"
}

// str reads a JSON string (null: absent).
func (d *decoder) str(field string) (*string, error) {
	var s *string
	if err := d.value(field, &s); err != nil {
		return nil, err
	}
	return s, nil
}

// b64 reads a base64 (standard alphabet, padded) JSON string.
func (d *decoder) b64(field string) ([]byte, bool, error) {
	s, err := d.str(field)
	if err != nil || s == nil {
		return nil, false, err
	}
	b, err := base64.StdEncoding.Strict().DecodeString(*s)
	if err != nil {
		return nil, false, invalid("%s: not standard padded base64: %v", field, err)
	}
	return b, true, nil
}

// number reads a JSON number (or a decimal string, for clients whose
// numbers are doubles) as its literal; null is absent.
func (d *decoder) number(field string) (string, bool, error) {
	var n *json.Number
	if err := d.value(field, &n); err != nil {
		return "", false, err
	}
	if n == nil {
		return "", false, nil
	}
	return n.String(), true, nil
}

// millis reads a duration in whole milliseconds within [min, max].
func (d *decoder) millis(field string, min, max time.Duration) (time.Duration, bool, error) {
	lit, ok, err := d.number(field)
	if err != nil || !ok {
		return 0, false, err
	}
	n, err := strconv.ParseInt(lit, 10, 64)
	if err != nil {
		return 0, false, invalid("%s: %s is not a whole number of milliseconds", field, lit)
	}
	if n < int64(min/time.Millisecond) || n > int64(max/time.Millisecond) {
		return 0, false, invalid("%s: %d outside [%d, %d]", field, n, min/time.Millisecond, max/time.Millisecond)
	}
	return time.Duration(n) * time.Millisecond, true, nil
}

// token reads a fencing token (a positive integer).
func (d *decoder) token(field string) (uint64, error) {
	lit, ok, err := d.number(field)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, invalid("%s is required", field)
	}
	t, err := strconv.ParseUint(lit, 10, 64)
	if err != nil || t == 0 {
		return 0, invalid("%s: %s is not a token (a positive integer below 2^64)", field, lit)
	}
	return t, nil
}

// bytesField is a value that travels as a JSON string (text) or as base64
// (any bytes) under name+"_b64".
type bytesField struct {
	v      []byte
	set    bool
	field  string // the member that set it, for errors
	twoSet bool
}

func (f *bytesField) text(d *decoder, name string) error {
	s, err := d.str(name)
	if err != nil || s == nil {
		return err
	}
	f.put([]byte(*s), name)
	return nil
}

func (f *bytesField) base64(d *decoder, name string) error {
	b, ok, err := d.b64(name)
	if err != nil || !ok {
		return err
	}
	f.put(b, name)
	return nil
}

func (f *bytesField) put(b []byte, name string) {
	if f.set {
		f.twoSet = true
	}
	f.v, f.set, f.field = b, true, name
}

func (f *bytesField) check(name string) error {
	if f.twoSet {
		return invalid("give %s or %s_b64, not both", name, name)
	}
	return nil
}

// key checks a key field: present, one form, within idem's limits.
func (f *bytesField) key() ([]byte, error) {
	if err := f.check("key"); err != nil {
		return nil, err
	}
	if !f.set {
		return nil, invalidKey("key (or key_b64) is required")
	}
	if err := idem.ValidateKey(f.v); err != nil {
		return nil, invalidKey("%s: %v", f.field, err)
	}
	return f.v, nil
}

// Requests as decoded.

type claimReq struct {
	key, fp    []byte
	lease, ttl time.Duration
}

var claimFields = []string{"key", "key_b64", "fingerprint", "fingerprint_b64", "lease_ms", "ttl_ms"}

// claim reads one claim object; defaults gives lease and ttl when absent.
func (d *decoder) claim(what string, defaults claimReq) (claimReq, error) {
	var key, fp bytesField
	c := defaults
	err := d.object(what, claimFields, func(i int) error {
		var err error
		switch i {
		case 0:
			err = key.text(d, "key")
		case 1:
			err = key.base64(d, "key_b64")
		case 2:
			err = fp.text(d, "fingerprint")
		case 3:
			err = fp.base64(d, "fingerprint_b64")
		case 4:
			var ok bool
			var v time.Duration
			if v, ok, err = d.millis("lease_ms", idem.MinDuration, idem.MaxLease); ok {
				c.lease = v
			}
		case 5:
			var ok bool
			var v time.Duration
			if v, ok, err = d.millis("ttl_ms", idem.MinDuration, idem.MaxTTL); ok {
				c.ttl = v
			}
		}
		return err
	})
	if err != nil {
		return c, err
	}
	if c.key, err = key.key(); err != nil {
		return c, err
	}
	if err := fp.check("fingerprint"); err != nil {
		return c, err
	}
	if len(fp.v) > idem.MaxFingerprintLen {
		return c, invalid("%s is %d bytes, the limit is %d", fp.field, len(fp.v), idem.MaxFingerprintLen)
	}
	c.fp = fp.v
	return c, nil
}

// decodeClaim decodes POST /v1/claim.
func decodeClaim(body []byte, defaults claimReq) (claimReq, error) {
	d, err := newDecoder(body)
	if err != nil {
		return claimReq{}, err
	}
	c, err := d.claim("body", defaults)
	if err != nil {
		return claimReq{}, err
	}
	return c, d.end()
}

// decodeBatch decodes POST /v1/claim/batch. Any invalid entry rejects the
// whole batch, so nothing is stored.
func decodeBatch(body []byte, defaults claimReq, max int) ([]claimReq, error) {
	d, err := newDecoder(body)
	if err != nil {
		return nil, err
	}
	var out []claimReq
	got := false
	err = d.object("body", []string{"claims"}, func(int) error {
		t, err := d.dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		if t != json.Delim('[') {
			return invalid("claims: want an array")
		}
		got = true
		for d.dec.More() {
			if len(out) == max {
				return invalid("claims: more than %d entries (the batch limit)", max)
			}
			what := fmt.Sprintf("claims[%d]", len(out))
			c, err := d.claim(what, defaults)
			if err != nil {
				var br *badRequest
				if errors.As(err, &br) && !strings.HasPrefix(br.detail, what) {
					br.detail = what + ": " + br.detail
				}
				return err
			}
			out = append(out, c)
		}
		_, err = d.dec.Token() // ']'
		if err != nil {
			return syntaxError(err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !got || len(out) == 0 {
		return nil, invalid("claims: want a non-empty array")
	}
	return out, d.end()
}

// settleReq is a complete, release, fail or extend request.
type settleReq struct {
	key    []byte
	token  uint64
	result []byte        // complete
	cause  string        // release, fail
	lease  time.Duration // extend
}

// Which members each settle call takes.
const (
	opComplete = iota
	opRelease
	opFail
	opExtend
)

var settleFields = [...][]string{
	opComplete: {"key", "key_b64", "token", "result", "result_b64"},
	opRelease:  {"key", "key_b64", "token", "error"},
	opFail:     {"key", "key_b64", "token", "error"},
	opExtend:   {"key", "key_b64", "token", "lease_ms"},
}

// decodeSettle decodes POST /v1/complete, /release, /fail, /extend.
func decodeSettle(body []byte, op int) (settleReq, error) {
	d, err := newDecoder(body)
	if err != nil {
		return settleReq{}, err
	}
	var s settleReq
	var key, result bytesField
	var haveToken, haveLease bool
	names := settleFields[op]
	err = d.object("body", names, func(i int) error {
		var err error
		switch names[i] {
		case "key":
			err = key.text(d, "key")
		case "key_b64":
			err = key.base64(d, "key_b64")
		case "token":
			s.token, err = d.token("token")
			haveToken = err == nil
		case "result":
			err = result.text(d, "result")
		case "result_b64":
			err = result.base64(d, "result_b64")
		case "error":
			var c *string
			if c, err = d.str("error"); c != nil {
				s.cause = *c
			}
		case "lease_ms":
			s.lease, haveLease, err = d.millis("lease_ms", idem.MinDuration, idem.MaxLease)
		}
		return err
	})
	if err != nil {
		return settleReq{}, err
	}
	if err := d.end(); err != nil {
		return settleReq{}, err
	}
	if s.key, err = key.key(); err != nil {
		return settleReq{}, err
	}
	if !haveToken {
		return settleReq{}, invalid("token is required")
	}
	if err := result.check("result"); err != nil {
		return settleReq{}, err
	}
	s.result = result.v
	if len(s.result) > idem.MaxResultLen {
		return settleReq{}, invalid("%s is %d bytes, the limit is %d", result.field, len(s.result), idem.MaxResultLen)
	}
	if len(s.cause) > idem.MaxCauseLen {
		return settleReq{}, invalid("error is %d bytes, the limit is %d", len(s.cause), idem.MaxCauseLen)
	}
	if op == opExtend && !haveLease {
		return settleReq{}, invalid("lease_ms is required")
	}
	return s, nil
}

// queryKey reads the key of GET/DELETE /v1/records from the query string:
// key (percent-encoded bytes) or key_b64.
func queryKey(rawQuery string) ([]byte, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, invalid("query: %v", err)
	}
	var f bytesField
	for name, vs := range q {
		switch name {
		case "key", "key_b64":
		default:
			return nil, invalid("query: unknown parameter %q", name)
		}
		if len(vs) > 1 {
			return nil, invalid("query: %s given %d times", name, len(vs))
		}
		if name == "key" {
			f.put([]byte(vs[0]), name)
			continue
		}
		b, err := base64.StdEncoding.Strict().DecodeString(vs[0])
		if err != nil {
			// '+' in a query means a space unless percent-encoded: say so.
			return nil, invalid("key_b64: not standard padded base64 (percent-encode '+' and '/' in a query): %v", err)
		}
		f.put(b, name)
	}
	return f.key()
}
