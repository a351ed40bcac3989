package remoting

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

// goClientFrame is a heartbeat-like request as the Go client writes it
// (JSON header, language "GO", version 317), and javaResponse a response
// as a 4.9 broker writes it (fastjson: sorted keys, the serialize type
// field, no remark when null).
var (
	goClientFrame = frame(0, `{"code":34,"language":"GO","version":317,"opaque":7,"flag":0,"remark":"","extFields":{"consumerGroup":"g"}}`, []byte(`{"clientID":"x"}`))
	javaResponse  = frame(0, `{"code":0,"extFields":{"offset":"12"},"flag":1,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":409}`, nil)
)

func frame(ser byte, header string, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(4+len(header)+len(body)))
	b = binary.BigEndian.AppendUint32(b, uint32(ser)<<24|uint32(len(header)))
	b = append(b, header...)
	return append(b, body...)
}

func TestDecodeClientAndBrokerFrames(t *testing.T) {
	c, err := ReadFrame(bytes.NewReader(goClientFrame))
	if err != nil {
		t.Fatal(err)
	}
	if c.Code != HeartBeat || c.Language != "GO" || c.Version != 317 || c.Opaque != 7 || c.IsResponse() || c.Field("consumerGroup") != "g" || string(c.Body) != `{"clientID":"x"}` {
		t.Fatalf("client frame decoded as %+v", c)
	}
	r, err := ReadFrame(bytes.NewReader(javaResponse))
	if err != nil {
		t.Fatal(err)
	}
	if !r.IsResponse() || r.Code != Success || r.Int("offset", -1) != 12 || r.Language != "JAVA" || r.Body != nil {
		t.Fatalf("broker frame decoded as %+v", r)
	}
}

// TestRocketMQSerialization checks the ROCKETMQ header layout byte by
// byte: code int16, language byte, version int16, opaque int32, flag
// int32, remark (int32 length), ext fields (int32 length; int16 key
// length, key, int32 value length, value).
func TestRocketMQSerialization(t *testing.T) {
	c := &Command{Code: PullMessage, Language: "GO", Version: 317, Opaque: 3, Flag: FlagOneway, Remark: "r",
		ExtFields: map[string]string{"k": "vv"}, Body: []byte("B"), Serialize: SerializeRocketMQ}
	b, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	header := []byte{0, 11, 9, 1, 0x3d, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 'r', 0, 0, 0, 9, 0, 1, 'k', 0, 0, 0, 2, 'v', 'v'}
	want := frame(SerializeRocketMQ, string(header), []byte("B"))
	if !bytes.Equal(b, want) {
		t.Fatalf("encoded\n%x, want\n%x", b, want)
	}
	d, err := ReadFrame(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d, c) {
		t.Fatalf("round trip: %+v, want %+v", d, c)
	}
}

func TestDecodeRejects(t *testing.T) {
	for name, f := range map[string][]byte{
		"header longer than frame": frame(0, `{}`, nil)[:9],
		"unknown serialisation":    frame(7, `{}`, nil),
		"JSON trailing data":       frame(0, `{"code":1}{}`, nil),
		"ROCKETMQ truncated":       frame(1, "\x00\x01", nil),
		"length under 4":           {0, 0, 0, 2, 0, 0},
	} {
		if _, err := ReadFrame(bytes.NewReader(f)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func TestProperties(t *testing.T) {
	m := map[string]string{"KEYS": "a b", "idem-message-id": "m-1", "x": "héllo wörld"}
	s := EncodeProperties(m)
	if s != "KEYS\x01a b\x02idem-message-id\x01m-1\x02x\x01héllo wörld\x02" {
		t.Fatalf("EncodeProperties = %q", s)
	}
	if got := DecodeProperties(s); !reflect.DeepEqual(got, m) {
		t.Fatalf("DecodeProperties = %v", got)
	}
	// Malformed items are skipped, as the clients do.
	if got := DecodeProperties("a\x01b\x02junk\x02c\x01d\x01e\x02"); !reflect.DeepEqual(got, map[string]string{"a": "b"}) {
		t.Fatalf("malformed: %v", got)
	}
}

func sample() *Stored {
	return &Stored{QueueID: 2, Flag: 5, QueueOffset: 17, CommitLogOffset: 4096, SysFlag: SysFlagCompressed,
		BornTimestamp: 1700000000000, BornHost: netip.MustParseAddrPort("10.0.0.1:4000"),
		StoreTimestamp: 1700000000001, StoreHost: netip.MustParseAddrPort("[::1]:10911"),
		ReconsumeTimes: 3, Body: []byte("body"), Topic: "orders", Properties: "KEYS\x01k\x02"}
}

func TestStoredRoundTrip(t *testing.T) {
	a, b := sample(), sample()
	b.Topic, b.Body, b.StoreHost = "%RETRY%g", nil, netip.MustParseAddrPort("127.0.0.1:10911")
	var buf []byte
	for _, m := range []*Stored{a, b} {
		var err error
		if buf, err = AppendStored(buf, m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := DecodeStored(buf)
	if err != nil {
		t.Fatal(err)
	}
	a.SysFlag |= SysFlagStoreHostV6 // set from the address family
	b.Body = []byte{}
	if len(got) != 2 || !reflect.DeepEqual(got[0], a) || !reflect.DeepEqual(got[1], b) {
		t.Fatalf("decoded %+v\n%+v", got[0], got[1])
	}
	if id := b.OffsetMsgID(); id != "7F00000100002A9F0000000000001000" {
		t.Fatalf("OffsetMsgID = %s", id)
	}
	// A flipped body byte fails the CRC; a wrong total size is refused.
	bad := append([]byte(nil), buf...)
	bad[bytes.Index(bad, []byte("body"))] ^= 1
	if _, err := DecodeStored(bad); err == nil || !strings.Contains(err.Error(), "CRC") {
		t.Errorf("corrupt body: %v", err)
	}
	if _, err := DecodeStored(buf[:len(buf)-1]); err == nil {
		t.Error("truncated message decoded")
	}
}

func TestBatchedRoundTrip(t *testing.T) {
	var buf []byte
	in := []*Batched{{Flag: 1, Body: []byte("a"), Properties: "x\x01y\x02"}, {Body: []byte{}, Properties: ""}}
	for _, m := range in {
		buf, _ = AppendBatched(buf, m)
	}
	got, err := DecodeBatched(buf)
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("DecodeBatched = %+v, %v", got, err)
	}
}

// TestConn: requests are matched to responses by opaque, out of order;
// requests from the peer are ignored; a closed connection fails pending
// and later calls.
func TestConn(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		a, _ := ReadFrame(nc)
		b, _ := ReadFrame(nc)
		_ = WriteFrame(nc, &Command{Code: NotifyConsumerIdsChanged, Flag: FlagOneway, Opaque: b.Opaque})
		for _, req := range []*Command{b, a} {
			r := ResponseTo(req, Success, req.Field("n"))
			_ = WriteFrame(nc, r)
		}
		ReadFrame(nc) // the third request: never answered
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res := make(chan string, 2)
	for _, n := range []string{"one", "two"} {
		go func() {
			r, err := c.Invoke(ctx, &Command{Code: GetMaxOffset, ExtFields: map[string]string{"n": n}, Serialize: SerializeRocketMQ})
			if err != nil {
				res <- err.Error()
				return
			}
			res <- n + "=" + r.Remark
		}()
		time.Sleep(20 * time.Millisecond)
	}
	got := []string{<-res, <-res}
	if !(got[0] == "two=two" && got[1] == "one=one") && !(got[0] == "one=one" && got[1] == "two=two") {
		t.Fatalf("responses %v", got)
	}
	if _, err := c.Invoke(ctx, &Command{Code: GetMaxOffset}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("request on a connection the peer closed: %v", err)
	}
}
