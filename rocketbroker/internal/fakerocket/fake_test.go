package fakerocket

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
)

// These tests speak the wire protocol to the fake directly; the adapter's
// tests run the official client against it.

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func dial(t *testing.T, addr string) *remoting.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := remoting.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func call(t *testing.T, c *remoting.Conn, code int, ext map[string]string, body []byte) *remoting.Command {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Invoke(ctx, &remoting.Command{Code: code, Language: "GO", Version: 317, ExtFields: ext, Body: body})
	if err != nil {
		t.Fatalf("request %d: %v", code, err)
	}
	return r
}

func send(t *testing.T, c *remoting.Conn, topic string, queue int, props map[string]string, body string, reconsume int) *remoting.Command {
	t.Helper()
	return call(t, c, remoting.SendMessage, sendFields(topic, queue, props, reconsume), []byte(body))
}

func sendFields(topic string, queue int, props map[string]string, reconsume int) map[string]string {
	return map[string]string{
		"producerGroup": "p", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
		"queueId": strconv.Itoa(queue), "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "0",
		"properties": remoting.EncodeProperties(props), "reconsumeTimes": strconv.Itoa(reconsume),
		"maxReconsumeTimes": "2",
	}
}

func pull(t *testing.T, c *remoting.Conn, group, topic string, queue int, offset int64, suspend time.Duration) (*remoting.Command, []*remoting.Stored) {
	t.Helper()
	sys := "0"
	if suspend > 0 {
		sys = "2"
	}
	r := call(t, c, remoting.PullMessage, map[string]string{"consumerGroup": group, "topic": topic, "queueId": strconv.Itoa(queue),
		"queueOffset": strconv.FormatInt(offset, 10), "maxMsgNums": "32", "sysFlag": sys, "commitOffset": "0",
		"suspendTimeoutMillis": strconv.FormatInt(suspend.Milliseconds(), 10), "subscription": "*", "subVersion": "0", "expressionType": "TAG"}, nil)
	msgs, err := remoting.DecodeStored(r.Body)
	if err != nil {
		t.Fatalf("pull body: %v", err)
	}
	return r, msgs
}

func TestRoute(t *testing.T) {
	s := start(t, Config{})
	s.CreateTopic("orders", 3)
	ns := dial(t, s.NameServerAddr())
	r := call(t, ns, remoting.GetRouteInfoByTopic, map[string]string{"topic": "orders"}, nil)
	// A pre-4.9.4 client (version 317) gets fastjson's unquoted map keys.
	want := `{"brokerDatas":[{"brokerAddrs":{0:"` + s.BrokerAddr() + `"},"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},` +
		`"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":3,"topicSysFlag":0,"writeQueueNums":3}]}`
	if r.Code != remoting.Success || string(r.Body) != want {
		t.Fatalf("route: %d %s", r.Code, r.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r2, err := ns.Invoke(ctx, &remoting.Command{Code: remoting.GetRouteInfoByTopic, Version: 409, ExtFields: map[string]string{"topic": "orders"}})
	if err != nil || !json.Valid(r2.Body) {
		t.Fatalf("4.9.4+ route is not standard JSON: %s %v", r2.Body, err)
	}
	if r := call(t, ns, remoting.GetRouteInfoByTopic, map[string]string{"topic": "nope"}, nil); r.Code != remoting.TopicNotExist {
		t.Fatalf("unknown topic: code %d", r.Code)
	}
	if r := call(t, ns, 9999, nil, nil); r.Code != remoting.RequestCodeNotSupported {
		t.Fatalf("unknown code: %d", r.Code)
	}
}

// TestSendPull: a send is stored at the next offset of its queue with the
// CLUSTER property, and a pull returns it in the store format; a pull at
// the end of the queue waits (long polling) and wakes on the next send.
func TestSendPull(t *testing.T) {
	s := start(t, Config{})
	br := dial(t, s.BrokerAddr())
	r := send(t, br, "auto", 1, map[string]string{"KEYS": "k1", "a": "b"}, "hello", 0)
	if r.Code != remoting.Success || r.Field("queueId") != "1" || r.Field("queueOffset") != "0" || len(r.Field("msgId")) != 32 {
		t.Fatalf("send: %+v", r)
	}
	if got := s.Messages("auto"); len(got) != 1 || got[0].Properties["CLUSTER"] != "DefaultCluster" || got[0].Properties["a"] != "b" {
		t.Fatalf("stored %+v", got)
	}
	resp, msgs := pull(t, br, "g", "auto", 1, 0, 0)
	if resp.Code != remoting.Success || len(msgs) != 1 || string(msgs[0].Body) != "hello" || msgs[0].Topic != "auto" ||
		msgs[0].QueueID != 1 || msgs[0].OffsetMsgID() != r.Field("msgId") || resp.Field("nextBeginOffset") != "1" || resp.Field("maxOffset") != "1" {
		t.Fatalf("pull: %+v %+v", resp, msgs)
	}
	if resp, _ := pull(t, br, "g", "auto", 1, 1, 0); resp.Code != remoting.PullNotFound || resp.Field("nextBeginOffset") != "1" {
		t.Fatalf("pull at the end without suspend: %+v", resp)
	}
	if resp, _ := pull(t, br, "g", "auto", 1, 5, 0); resp.Code != remoting.PullOffsetMoved || resp.Field("nextBeginOffset") != "1" {
		t.Fatalf("pull past the end: %+v", resp)
	}
	// The sender reports back rather than calling t.Fatal off the test's
	// goroutine, and the test waits for it: the long poll can wake before
	// the sender has read its own response, and the test's cleanup would
	// then close the sender's connection under it.
	sent := make(chan error, 1)
	second := dial(t, s.BrokerAddr())
	go func() {
		time.Sleep(200 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := second.Invoke(ctx, &remoting.Command{Code: remoting.SendMessage, Language: "GO", Version: 317, ExtFields: sendFields("auto", 1, nil, 0), Body: []byte("second")})
		if err == nil && r.Code != remoting.Success {
			err = fmt.Errorf("send: code %d %s", r.Code, r.Remark)
		}
		sent <- err
	}()
	began := time.Now()
	resp, msgs = pull(t, br, "g", "auto", 1, 1, 20*time.Second)
	if err := <-sent; err != nil {
		t.Fatalf("second send: %v", err)
	}
	if resp.Code != remoting.Success || len(msgs) != 1 || string(msgs[0].Body) != "second" {
		t.Fatalf("long poll: %+v after %s", resp, time.Since(began))
	}
	if r := send(t, br, "bad topic", 0, nil, "x", 0); r.Code != remoting.MessageIllegal {
		t.Fatalf("illegal topic name: %d", r.Code)
	}
	strict := start(t, Config{NoAutoCreate: true})
	if r := send(t, dial(t, strict.BrokerAddr()), "auto", 0, nil, "x", 0); r.Code != remoting.TopicNotExist {
		t.Fatalf("auto-creation off: %d", r.Code)
	}
}

// TestSendBack: CONSUMER_SEND_MSG_BACK copies the message to %RETRY%group
// with reconsume times + 1 after its delay level, keeping RETRY_TOPIC and
// ORIGIN_MESSAGE_ID from the first send-back; at the maximum, or with a
// negative level, it goes to %DLQ%group at once.
func TestSendBack(t *testing.T) {
	s := start(t, Config{DelayLevels: []time.Duration{100 * time.Millisecond, time.Hour}})
	br := dial(t, s.BrokerAddr())
	send(t, br, "orders", 0, map[string]string{"x": "y"}, "m", 0)
	_, msgs := pull(t, br, "g", "orders", 0, 0, 0)
	back := func(m *remoting.Stored, level int) {
		r := call(t, br, remoting.ConsumerSendMsgBack, map[string]string{"group": "g", "offset": strconv.FormatInt(m.CommitLogOffset, 10),
			"delayLevel": strconv.Itoa(level), "originMsgId": m.OffsetMsgID(), "originTopic": m.Topic, "maxReconsumeTimes": "2"}, nil)
		if r.Code != remoting.Success {
			t.Fatalf("send back: %+v", r)
		}
	}
	back(msgs[0], 1)
	if sc := s.Scheduled("%RETRY%g"); len(sc) != 1 || sc[0].Properties["DELAY"] != "1" {
		t.Fatalf("scheduled: %+v", sc)
	}
	var retry []Message
	for deadline := time.Now().Add(5 * time.Second); len(retry) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		retry = s.Messages("%RETRY%g")
	}
	if len(retry) != 1 || retry[0].ReconsumeTimes != 1 || retry[0].Properties["RETRY_TOPIC"] != "orders" || retry[0].Properties["x"] != "y" ||
		retry[0].Properties["ORIGIN_MESSAGE_ID"] != msgs[0].OffsetMsgID() || retry[0].Properties["DELAY"] != "" {
		t.Fatalf("retry copy: %+v", retry)
	}
	_, rm := pull(t, br, "g", "%RETRY%g", 0, 0, 0)
	back(rm[0], 2) // reconsume 1 -> 2 (level 2: an hour)
	if sc := s.Scheduled("%RETRY%g"); len(sc) != 1 || sc[0].ReconsumeTimes != 2 || sc[0].Properties["ORIGIN_MESSAGE_ID"] != msgs[0].OffsetMsgID() {
		t.Fatalf("second send-back: %+v", sc)
	}
	// A copy with reconsume times 2 = max: to the DLQ.
	send(t, br, "%RETRY%g", 0, map[string]string{"RETRY_TOPIC": "orders"}, "at max", 2)
	// A negative level: to the DLQ whatever the count.
	back(msgs[0], -1)
	dlq := s.Messages("%DLQ%g")
	if len(dlq) != 2 || string(dlq[0].Body) != "at max" || dlq[1].ReconsumeTimes != 1 {
		t.Fatalf("DLQ: %+v", dlq)
	}
	if r := call(t, br, remoting.ConsumerSendMsgBack, map[string]string{"group": "g", "offset": "999999"}, nil); r.Code != remoting.SystemError {
		t.Fatalf("send-back of an unknown offset: %d", r.Code)
	}
}

// TestGroupMembership: a heartbeat registers its client in its groups
// (and creates the retry topic); when its connection closes the client is
// removed and the group's other members are told.
func TestGroupMembership(t *testing.T) {
	s := start(t, Config{})
	hb := func(c *remoting.Conn, id string) {
		body, _ := json.Marshal(map[string]any{"clientID": id, "producerDataSet": []any{},
			"consumerDataSet": []any{map[string]any{"groupName": "g", "messageModel": "CLUSTERING"}}})
		if r := call(t, c, remoting.HeartBeat, nil, body); r.Code != remoting.Success {
			t.Fatalf("heartbeat: %+v", r)
		}
	}
	// The first member reads notifications on a raw connection.
	nc, err := net.Dial("tcp", s.BrokerAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body, _ := json.Marshal(map[string]any{"clientID": "a", "consumerDataSet": []any{map[string]any{"groupName": "g"}}})
	if err := remoting.WriteFrame(nc, &remoting.Command{Code: remoting.HeartBeat, Opaque: 1, Body: body, ExtFields: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	frames := make(chan *remoting.Command, 10)
	go func() {
		r := bufio.NewReader(nc)
		for {
			c, err := remoting.ReadFrame(r)
			if err != nil {
				close(frames)
				return
			}
			frames <- c
		}
	}()
	b := dial(t, s.BrokerAddr())
	next := func(want int) {
		t.Helper()
		for {
			select {
			case c := <-frames:
				if c.Code == want && !c.IsResponse() {
					return
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no frame %d", want)
			}
		}
	}
	next(remoting.NotifyConsumerIdsChanged) // its own registration
	hb(b, "b")
	next(remoting.NotifyConsumerIdsChanged) // b joined
	r := call(t, b, remoting.GetConsumerListByGroup, map[string]string{"consumerGroup": "g"}, nil)
	if !strings.Contains(string(r.Body), `["a","b"]`) {
		t.Fatalf("consumer list: %s", r.Body)
	}
	if !strings.Contains(strings.Join(s.Topics(), ","), "%RETRY%g") {
		t.Fatalf("no retry topic after a heartbeat: %v", s.Topics())
	}
	b.Close()
	next(remoting.NotifyConsumerIdsChanged) // b's connection closed
	if ids := s.Clients("g"); len(ids) != 1 || ids[0] != "a" {
		t.Fatalf("members after b left: %v", ids)
	}
}

func TestOffsetsAndLocks(t *testing.T) {
	s := start(t, Config{LockExpiry: 200 * time.Millisecond})
	s.CreateTopic("o", 2)
	br := dial(t, s.BrokerAddr())
	q := map[string]string{"consumerGroup": "g", "topic": "o", "queueId": "1"}
	if r := call(t, br, remoting.QueryConsumerOffset, q, nil); r.Code != remoting.Success || r.Field("offset") != "0" {
		t.Fatalf("first query: %+v", r)
	}
	u := map[string]string{"consumerGroup": "g", "topic": "o", "queueId": "1", "commitOffset": "7"}
	call(t, br, remoting.UpdateConsumerOffset, u, nil)
	if r := call(t, br, remoting.QueryConsumerOffset, q, nil); r.Field("offset") != "7" {
		t.Fatalf("after update: %+v", r)
	}
	lock := func(client string, code int) string {
		body, _ := json.Marshal(map[string]any{"consumerGroup": "g", "clientId": client, "mqSet": []any{map[string]any{"topic": "o", "brokerName": "broker-a", "queueId": 0}}})
		return string(call(t, br, code, nil, body).Body)
	}
	if got := lock("a", remoting.LockBatchMQ); !strings.Contains(got, `"queueId":0`) {
		t.Fatalf("lock: %s", got)
	}
	if got := lock("b", remoting.LockBatchMQ); strings.Contains(got, `"queueId":0`) {
		t.Fatalf("b locked a's queue: %s", got)
	}
	time.Sleep(300 * time.Millisecond)
	if got := lock("b", remoting.LockBatchMQ); !strings.Contains(got, `"queueId":0`) {
		t.Fatalf("expired lock not taken: %s", got)
	}
	lock("b", remoting.UnlockBatchMQ)
	if got := lock("a", remoting.LockBatchMQ); !strings.Contains(got, `"queueId":0`) {
		t.Fatalf("unlocked queue not taken: %s", got)
	}
}

// TestRocketMQSerialisedRequest: a request with the ROCKETMQ header gets
// its answer in the same serialisation.
func TestRocketMQSerialisedRequest(t *testing.T) {
	s := start(t, Config{})
	s.CreateTopic("o", 1)
	br := dial(t, s.BrokerAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := br.Invoke(ctx, &remoting.Command{Code: remoting.GetMaxOffset, Language: "JAVA", Serialize: remoting.SerializeRocketMQ,
		ExtFields: map[string]string{"topic": "o", "queueId": "0"}})
	if err != nil || r.Serialize != remoting.SerializeRocketMQ || r.Code != remoting.Success || r.Field("offset") != "0" {
		t.Fatalf("%+v %v", r, err)
	}
}
