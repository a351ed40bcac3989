package httpidem

import (
	"encoding/binary"
	"errors"
	"net/http"
	"net/textproto"
	"sort"
)

// A stored response is the record's result:
//
//	"IDH1" | status: uint16 big-endian | header count: uvarint |
//	  per header value: name length uvarint, name, value length uvarint, value |
//	body (the rest)
//
// Header names are canonical; hop-by-hop headers, Date and Content-Length
// are not stored (a replay gets its own).
const magic = "IDH1"

var errBadResponse = errors.New("httpidem: stored response is damaged")

// response is a captured or stored response.
type response struct {
	status int
	header http.Header
	body   []byte
}

// notStored are headers a replay must not copy: hop-by-hop ones (RFC 9110
// 7.6.1) and those the server recomputes.
var notStored = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Date": true, "Content-Length": true,
}

func (r *response) encode() []byte {
	type field struct{ name, value string }
	fields := make([]field, 0, len(r.header))
	n := len(magic) + 2 + binary.MaxVarintLen64 + len(r.body)
	for key, vs := range r.header {
		name := textproto.CanonicalMIMEHeaderKey(key)
		if notStored[name] {
			continue
		}
		for _, v := range vs {
			fields = append(fields, field{name, v})
			n += 2*binary.MaxVarintLen64 + len(name) + len(v)
		}
	}
	// The same response encodes the same way; values of a name keep their
	// order.
	sort.SliceStable(fields, func(i, j int) bool { return fields[i].name < fields[j].name })
	b := make([]byte, 0, n)
	b = append(b, magic...)
	b = binary.BigEndian.AppendUint16(b, uint16(r.status))
	b = binary.AppendUvarint(b, uint64(len(fields)))
	for _, f := range fields {
		b = binary.AppendUvarint(b, uint64(len(f.name)))
		b = append(b, f.name...)
		b = binary.AppendUvarint(b, uint64(len(f.value)))
		b = append(b, f.value...)
	}
	return append(b, r.body...)
}

func decodeResponse(b []byte) (response, error) {
	if len(b) < len(magic)+2 || string(b[:len(magic)]) != magic {
		return response{}, errBadResponse
	}
	b = b[len(magic):]
	r := response{status: int(binary.BigEndian.Uint16(b)), header: http.Header{}}
	if r.status < 100 || r.status > 999 {
		return response{}, errBadResponse
	}
	b = b[2:]
	count, n := binary.Uvarint(b)
	if n <= 0 || count > uint64(len(b)) { // each value takes at least two bytes
		return response{}, errBadResponse
	}
	b = b[n:]
	field := func() (string, bool) {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return "", false
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		return s, true
	}
	for range count {
		name, ok := field()
		if !ok || name == "" {
			return response{}, errBadResponse
		}
		v, ok := field()
		if !ok {
			return response{}, errBadResponse
		}
		r.header[name] = append(r.header[name], v)
	}
	r.body = b
	return r, nil
}
