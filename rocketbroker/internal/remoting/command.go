package remoting

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
)

// Header serialisations: the high byte of a frame's header-length word.
const (
	SerializeJSON     byte = 0
	SerializeRocketMQ byte = 1
)

// Flag bits.
const (
	FlagResponse int32 = 1 // the frame answers the request with the same opaque
	FlagOneway   int32 = 2 // the request wants no answer
)

// MaxFrame is the largest frame accepted (the Java remoting layer's
// default frameMaxLength, 16 MiB).
const MaxFrame = 16 << 20

// Language codes of the ROCKETMQ header serialisation (the JSON one
// carries the name).
var languages = []string{"JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS", "RUST"}

// Command is one remoting frame: a request or a response.
type Command struct {
	Code      int
	Language  string // "GO", "JAVA", ...
	Version   int
	Opaque    int32 // request id; the response carries the request's
	Flag      int32
	Remark    string
	ExtFields map[string]string
	Body      []byte

	// Serialize is how the header is (to be) encoded: SerializeJSON or
	// SerializeRocketMQ. A response uses its request's.
	Serialize byte
}

// IsResponse reports whether c answers a request.
func (c *Command) IsResponse() bool { return c.Flag&FlagResponse != 0 }

// IsOneway reports whether c is a request that wants no answer.
func (c *Command) IsOneway() bool { return c.Flag&FlagOneway != 0 }

// Field returns ExtFields[k].
func (c *Command) Field(k string) string { return c.ExtFields[k] }

// Int returns ExtFields[k] as an integer, or def if absent or malformed.
func (c *Command) Int(k string, def int64) int64 {
	v, ok := c.ExtFields[k]
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return def
	}
	return n
}

// ResponseTo returns a response to req with code and remark, in req's
// serialisation.
func ResponseTo(req *Command, code int, remark string) *Command {
	return &Command{Code: code, Language: "JAVA", Version: ServerVersion, Opaque: req.Opaque,
		Flag: FlagResponse, Remark: remark, ExtFields: map[string]string{}, Serialize: req.Serialize}
}

// ServerVersion is the version a 4.9.8 broker or name server puts on its
// frames (MQVersion.Version.V4_9_8.ordinal()).
const ServerVersion = 409

// jsonHeader is the JSON header as both the Java and the Go peers write
// it. Unknown fields (serializeTypeCurrentRPC) are ignored.
type jsonHeader struct {
	Code      int               `json:"code"`
	Language  string            `json:"language"`
	Version   int               `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int32             `json:"flag"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields,omitempty"`
}

// Encode returns c as a whole frame: length, header length (with the
// serialisation in its high byte), header, body.
func Encode(c *Command) ([]byte, error) {
	var header []byte
	switch c.Serialize {
	case SerializeJSON:
		h, err := json.Marshal(jsonHeader{Code: c.Code, Language: c.Language, Version: c.Version, Opaque: c.Opaque,
			Flag: c.Flag, Remark: c.Remark, ExtFields: c.ExtFields})
		if err != nil {
			return nil, err
		}
		header = h
	case SerializeRocketMQ:
		h, err := encodeRocketMQHeader(c)
		if err != nil {
			return nil, err
		}
		header = h
	default:
		return nil, fmt.Errorf("remoting: unknown serialisation %d", c.Serialize)
	}
	if len(header) > 0xFFFFFF {
		return nil, errors.New("remoting: header too large")
	}
	total := 4 + len(header) + len(c.Body)
	if total+4 > MaxFrame {
		return nil, fmt.Errorf("remoting: frame of %d bytes over %d", total+4, MaxFrame)
	}
	out := make([]byte, 8, 4+total)
	binary.BigEndian.PutUint32(out[0:], uint32(total))
	binary.BigEndian.PutUint32(out[4:], uint32(c.Serialize)<<24|uint32(len(header)))
	out = append(out, header...)
	return append(out, c.Body...), nil
}

// Decode parses a frame without its leading length word (what follows it).
func Decode(frame []byte) (*Command, error) {
	if len(frame) < 4 {
		return nil, errors.New("remoting: frame shorter than its header length")
	}
	word := binary.BigEndian.Uint32(frame)
	ser, hlen := byte(word>>24), int(word&0xFFFFFF)
	if hlen > len(frame)-4 {
		return nil, fmt.Errorf("remoting: header length %d over the frame's %d bytes", hlen, len(frame)-4)
	}
	header := frame[4 : 4+hlen]
	var c *Command
	switch ser {
	case SerializeJSON:
		var h jsonHeader
		d := json.NewDecoder(bytes.NewReader(header))
		if err := d.Decode(&h); err != nil {
			return nil, fmt.Errorf("remoting: JSON header: %w", err)
		}
		if d.More() {
			return nil, errors.New("remoting: JSON header: trailing data")
		}
		c = &Command{Code: h.Code, Language: h.Language, Version: h.Version, Opaque: h.Opaque, Flag: h.Flag,
			Remark: h.Remark, ExtFields: h.ExtFields}
	case SerializeRocketMQ:
		var err error
		if c, err = decodeRocketMQHeader(header); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("remoting: unknown serialisation %d", ser)
	}
	c.Serialize = ser
	if c.ExtFields == nil {
		c.ExtFields = map[string]string{}
	}
	if body := frame[4+hlen:]; len(body) > 0 {
		c.Body = slices.Clone(body)
	}
	return c, nil
}

// ReadFrame reads one frame from r.
func ReadFrame(r io.Reader) (*Command, error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(l[:])
	if n < 4 || n > MaxFrame {
		return nil, fmt.Errorf("remoting: frame length %d not in [4, %d]", n, MaxFrame)
	}
	frame := make([]byte, n)
	if _, err := io.ReadFull(r, frame); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return Decode(frame)
}

// WriteFrame writes c to w as one frame.
func WriteFrame(w io.Writer, c *Command) error {
	b, err := Encode(c)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// The ROCKETMQ header: code int16, language byte, version int16, opaque
// int32, flag int32, remark (int32 length + bytes), ext fields (int32
// length + entries of int16 key length, key, int32 value length, value).
func encodeRocketMQHeader(c *Command) ([]byte, error) {
	if c.Code < -1<<15 || c.Code >= 1<<15 || c.Version < -1<<15 || c.Version >= 1<<15 {
		return nil, errors.New("remoting: code or version out of int16 range")
	}
	var ext []byte
	for _, k := range slices.Sorted(maps.Keys(c.ExtFields)) {
		v := c.ExtFields[k]
		if len(k) >= 1<<15 {
			return nil, errors.New("remoting: ext field name too long")
		}
		ext = binary.BigEndian.AppendUint16(ext, uint16(len(k)))
		ext = append(ext, k...)
		ext = binary.BigEndian.AppendUint32(ext, uint32(len(v)))
		ext = append(ext, v...)
	}
	b := make([]byte, 0, 21+len(c.Remark)+len(ext))
	b = binary.BigEndian.AppendUint16(b, uint16(int16(c.Code)))
	b = append(b, languageCode(c.Language))
	b = binary.BigEndian.AppendUint16(b, uint16(int16(c.Version)))
	b = binary.BigEndian.AppendUint32(b, uint32(c.Opaque))
	b = binary.BigEndian.AppendUint32(b, uint32(c.Flag))
	b = binary.BigEndian.AppendUint32(b, uint32(len(c.Remark)))
	b = append(b, c.Remark...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ext)))
	return append(b, ext...), nil
}

func languageCode(name string) byte {
	if i := slices.Index(languages, name); i >= 0 {
		return byte(i)
	}
	return 7 // OTHER
}

func decodeRocketMQHeader(h []byte) (*Command, error) {
	r := reader{b: h}
	c := &Command{}
	c.Code = int(int16(r.u16()))
	lang := r.u8()
	if int(lang) < len(languages) {
		c.Language = languages[lang]
	} else {
		c.Language = "OTHER"
	}
	c.Version = int(int16(r.u16()))
	c.Opaque = int32(r.u32())
	c.Flag = int32(r.u32())
	c.Remark = string(r.bytes(int(int32(r.u32()))))
	extLen := int(int32(r.u32()))
	ext := reader{b: r.bytes(extLen)}
	if r.err != nil {
		return nil, fmt.Errorf("remoting: ROCKETMQ header: %w", r.err)
	}
	if len(r.b) != 0 {
		return nil, errors.New("remoting: ROCKETMQ header: trailing data")
	}
	c.ExtFields = map[string]string{}
	for len(ext.b) > 0 && ext.err == nil {
		k := string(ext.bytes(int(ext.u16())))
		v := string(ext.bytes(int(int32(ext.u32()))))
		if ext.err == nil {
			c.ExtFields[k] = v
		}
	}
	if ext.err != nil {
		return nil, fmt.Errorf("remoting: ROCKETMQ ext fields: %w", ext.err)
	}
	return c, nil
}

var errShort = errors.New("truncated")

// reader reads big-endian fields, remembering the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = errShort
		r.b = nil
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) bytes(n int) []byte { return r.take(n) }
