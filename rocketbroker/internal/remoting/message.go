package remoting

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// Property separators of the message properties string.
const (
	NameValueSeparator = '\x01'
	PropertySeparator  = '\x02'
)

// EncodeProperties renders props as the properties string
// (name \x01 value \x02, for every pair; sorted so the output is stable).
func EncodeProperties(props map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		b.WriteString(k)
		b.WriteByte(NameValueSeparator)
		b.WriteString(props[k])
		b.WriteByte(PropertySeparator)
	}
	return b.String()
}

// DecodeProperties parses a properties string. Entries without exactly
// one separator are skipped, as the clients do.
func DecodeProperties(s string) map[string]string {
	props := map[string]string{}
	for item := range strings.SplitSeq(s, string(PropertySeparator)) {
		k, v, ok := strings.Cut(item, string(NameValueSeparator))
		if !ok || strings.IndexByte(v, NameValueSeparator) >= 0 {
			continue
		}
		props[k] = v
	}
	return props
}

// ValidProperty reports whether s can be a property name or value: the
// separators cannot be escaped.
func ValidProperty(s string) bool {
	return strings.IndexByte(s, NameValueSeparator) < 0 && strings.IndexByte(s, PropertySeparator) < 0
}

// MagicCode is the store format's magic number for version 1 messages
// (one-byte topic length), the one the 4.x clients decode.
const MagicCode int32 = -626843481

// System flag bits.
const (
	SysFlagCompressed   = 0x1
	SysFlagMultiTags    = 0x2
	SysFlagBornHostV6   = 0x1 << 4
	SysFlagStoreHostV6  = 0x1 << 5
	SysFlagTransactions = 0xC
)

// Stored is one message as a broker stores it and sends it in a pull
// response.
type Stored struct {
	QueueID                   int32
	Flag                      int32
	QueueOffset               int64
	CommitLogOffset           int64
	SysFlag                   int32
	BornTimestamp             int64 // ms
	BornHost                  netip.AddrPort
	StoreTimestamp            int64 // ms
	StoreHost                 netip.AddrPort
	ReconsumeTimes            int32
	PreparedTransactionOffset int64
	Body                      []byte
	Topic                     string
	Properties                string
}

// OffsetMsgID is the broker's id for the message: store host (address and
// port) and commit log offset, hex, upper case.
func (m *Stored) OffsetMsgID() string {
	return OffsetMsgID(m.StoreHost, m.CommitLogOffset)
}

// OffsetMsgID renders a broker message id.
func OffsetMsgID(host netip.AddrPort, commitLogOffset int64) string {
	var b []byte
	if host.Addr().Is4() {
		a := host.Addr().As4()
		b = append(b, a[:]...)
	} else {
		a := host.Addr().As16()
		b = append(b, a[:]...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(host.Port()))
	b = binary.BigEndian.AppendUint64(b, uint64(commitLogOffset))
	return strings.ToUpper(hex.EncodeToString(b))
}

// BodyCRC is the store's body checksum: CRC-32 (IEEE) with the sign bit
// cleared, as the Java store computes it.
func BodyCRC(body []byte) int32 { return int32(crc32.ChecksumIEEE(body) & 0x7FFFFFFF) }

func appendHost(b []byte, h netip.AddrPort) []byte {
	if h.Addr().Is4() {
		a := h.Addr().As4()
		b = append(b, a[:]...)
	} else {
		a := h.Addr().As16()
		b = append(b, a[:]...)
	}
	return binary.BigEndian.AppendUint32(b, uint32(h.Port()))
}

// AppendStored appends m in the store format: total size, magic code,
// body CRC, queue id, flag, queue offset, commit log offset, system flag,
// born timestamp and host, store timestamp and host, reconsume times,
// prepared transaction offset, body (int32 length), topic (byte length),
// properties (int16 length). The host flags in SysFlag are set from the
// hosts' address families.
func AppendStored(b []byte, m *Stored) ([]byte, error) {
	if len(m.Topic) > 127 {
		return nil, fmt.Errorf("remoting: topic %q over 127 bytes", m.Topic)
	}
	if len(m.Properties) > 32767 {
		return nil, fmt.Errorf("remoting: properties of %d bytes over 32767", len(m.Properties))
	}
	sys := m.SysFlag &^ (SysFlagBornHostV6 | SysFlagStoreHostV6)
	if !m.BornHost.Addr().Is4() {
		sys |= SysFlagBornHostV6
	}
	if !m.StoreHost.Addr().Is4() {
		sys |= SysFlagStoreHostV6
	}
	start := len(b)
	b = append(b, 0, 0, 0, 0) // total size, set below
	magic := MagicCode
	b = binary.BigEndian.AppendUint32(b, uint32(magic))
	b = binary.BigEndian.AppendUint32(b, uint32(BodyCRC(m.Body)))
	b = binary.BigEndian.AppendUint32(b, uint32(m.QueueID))
	b = binary.BigEndian.AppendUint32(b, uint32(m.Flag))
	b = binary.BigEndian.AppendUint64(b, uint64(m.QueueOffset))
	b = binary.BigEndian.AppendUint64(b, uint64(m.CommitLogOffset))
	b = binary.BigEndian.AppendUint32(b, uint32(sys))
	b = binary.BigEndian.AppendUint64(b, uint64(m.BornTimestamp))
	b = appendHost(b, m.BornHost)
	b = binary.BigEndian.AppendUint64(b, uint64(m.StoreTimestamp))
	b = appendHost(b, m.StoreHost)
	b = binary.BigEndian.AppendUint32(b, uint32(m.ReconsumeTimes))
	b = binary.BigEndian.AppendUint64(b, uint64(m.PreparedTransactionOffset))
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.Body)))
	b = append(b, m.Body...)
	b = append(b, byte(len(m.Topic)))
	b = append(b, m.Topic...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Properties)))
	b = append(b, m.Properties...)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b, nil
}

func readHost(r *reader, v6 bool) netip.AddrPort {
	n := 4
	if v6 {
		n = 16
	}
	raw := r.bytes(n)
	port := r.u32()
	if r.err == nil && port > 65535 {
		r.err = fmt.Errorf("port %d", port)
	}
	if r.err != nil {
		return netip.AddrPort{}
	}
	a, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(a, uint16(port))
}

// DecodeStored parses a pull response body: messages in the store format,
// back to back. Unlike the clients' decoder it checks every length and the
// total size of each message, and fails on anything malformed.
func DecodeStored(data []byte) ([]*Stored, error) {
	var out []*Stored
	for len(data) > 0 {
		if len(data) < 4 {
			return nil, errors.New("remoting: stored message: truncated size")
		}
		size := int(int32(binary.BigEndian.Uint32(data)))
		if size < 4 || size > len(data) {
			return nil, fmt.Errorf("remoting: stored message of %d bytes, %d left", size, len(data))
		}
		r := reader{b: data[4:size]}
		m := &Stored{}
		if magic := int32(r.u32()); r.err == nil && magic != MagicCode {
			return nil, fmt.Errorf("remoting: stored message: magic code %d", magic)
		}
		crc := int32(r.u32())
		m.QueueID = int32(r.u32())
		m.Flag = int32(r.u32())
		m.QueueOffset = int64(r.u64())
		m.CommitLogOffset = int64(r.u64())
		m.SysFlag = int32(r.u32())
		m.BornTimestamp = int64(r.u64())
		m.BornHost = readHost(&r, m.SysFlag&SysFlagBornHostV6 != 0)
		m.StoreTimestamp = int64(r.u64())
		m.StoreHost = readHost(&r, m.SysFlag&SysFlagStoreHostV6 != 0)
		m.ReconsumeTimes = int32(r.u32())
		m.PreparedTransactionOffset = int64(r.u64())
		m.Body = slices.Clone(r.bytes(int(int32(r.u32()))))
		m.Topic = string(r.bytes(int(int8(r.u8()))))
		m.Properties = string(r.bytes(int(int16(r.u16()))))
		if r.err != nil {
			return nil, fmt.Errorf("remoting: stored message: %w", r.err)
		}
		if len(r.b) != 0 {
			return nil, fmt.Errorf("remoting: stored message: %d bytes after its properties", len(r.b))
		}
		if crc != BodyCRC(m.Body) {
			return nil, errors.New("remoting: stored message: body CRC mismatch")
		}
		out = append(out, m)
		data = data[size:]
	}
	return out, nil
}

// Batched is one message of a batch send body.
type Batched struct {
	Flag       int32
	Body       []byte
	Properties string
}

// AppendBatched appends m in the batch format the clients send
// (SEND_BATCH_MESSAGE): total size, magic code (0), body CRC (0), flag,
// body (int32 length), properties (int16 length).
func AppendBatched(b []byte, m *Batched) ([]byte, error) {
	if len(m.Properties) > 32767 {
		return nil, fmt.Errorf("remoting: properties of %d bytes over 32767", len(m.Properties))
	}
	size := 20 + len(m.Body) + 2 + len(m.Properties)
	b = binary.BigEndian.AppendUint32(b, uint32(size))
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(m.Flag))
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.Body)))
	b = append(b, m.Body...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Properties)))
	return append(b, m.Properties...), nil
}

// DecodeBatched parses a batch send body.
func DecodeBatched(data []byte) ([]*Batched, error) {
	var out []*Batched
	for len(data) > 0 {
		if len(data) < 4 {
			return nil, errors.New("remoting: batched message: truncated size")
		}
		size := int(int32(binary.BigEndian.Uint32(data)))
		if size < 4 || size > len(data) {
			return nil, fmt.Errorf("remoting: batched message of %d bytes, %d left", size, len(data))
		}
		r := reader{b: data[4:size]}
		r.u32() // magic code
		r.u32() // body CRC
		m := &Batched{Flag: int32(r.u32())}
		m.Body = slices.Clone(r.bytes(int(int32(r.u32()))))
		m.Properties = string(r.bytes(int(int16(r.u16()))))
		if r.err != nil {
			return nil, fmt.Errorf("remoting: batched message: %w", r.err)
		}
		if len(r.b) != 0 {
			return nil, fmt.Errorf("remoting: batched message: %d bytes after its properties", len(r.b))
		}
		out = append(out, m)
		data = data[size:]
	}
	return out, nil
}
