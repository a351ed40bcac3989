// Package fakerocket is an in-process fake of a RocketMQ 4.x name server
// and one broker, speaking the remoting wire protocol on loopback TCP, for
// testing rocketbroker with the official Go client where no RocketMQ
// server can run (no JVM, no Docker).
//
// It implements exactly the requests the Go client (and the adapter's lag
// queries) make, with the Java broker's (4.9.x) semantics as read from its
// processors:
//
//   - name server: GET_ROUTEINFO_BY_TOPIC (the broker's topics; the
//     pre-4.9.4 fastjson form with unquoted broker ids for older clients,
//     standard JSON for newer ones), DELETE_TOPIC_IN_NAMESRV;
//   - broker: HEART_BEAT (registers the client in its consumer groups,
//     creates each group's %RETRY% topic, tells the group's other members
//     NOTIFY_CONSUMER_IDS_CHANGED), UNREGISTER_CLIENT, SEND_MESSAGE,
//     SEND_MESSAGE_V2, SEND_BATCH_MESSAGE (auto-creating topics from
//     TBW102 unless NoAutoCreate; DELAY levels through a schedule; a send
//     to %RETRY% past MAX_RECONSUME_TIMES goes to %DLQ%), PULL_MESSAGE
//     (store-format bodies, long polling up to the request's suspend
//     timeout, the commit offset it carries), QUERY_CONSUMER_OFFSET,
//     UPDATE_CONSUMER_OFFSET, GET_MAX_OFFSET, GET_MIN_OFFSET,
//     SEARCH_OFFSET_BY_TIMESTAMP, GET_CONSUMER_LIST_BY_GROUP,
//     CONSUMER_SEND_MSG_BACK (a copy to %RETRY%group with the delay level,
//     or to %DLQ%group once reconsume times reach the maximum or the level
//     is negative), LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (orderly consumption;
//     locks expire after LockExpiry), UPDATE_AND_CREATE_TOPIC,
//     DELETE_TOPIC_IN_BROKER. Anything else gets REQUEST_CODE_NOT_SUPPORTED.
//
// A client is removed from its groups when its connection closes (a
// process killed with SIGKILL: the kernel closes its sockets) or when it
// has sent no heartbeat for ClientExpiry; the group's other members are
// notified and rebalance at once. Messages live in memory for the life of
// the Server; nothing is written to disk, so "durable" means "stored in
// this process". Tag filtering is left to the client (which filters again
// anyway); transactions, ACLs, replicas, SQL92 filters and the 5.x
// protocols are not implemented.
//
// Beside the wire protocol, the Server has methods for tests to create
// topics, read what is stored, count requests and cut connections.
package fakerocket

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
)

// DefaultDelayLevels are the broker's default messageDelayLevel.
var DefaultDelayLevels = remoting.DefaultDelayLevels

// Config configures a Server. Zero values take the Java broker's defaults.
type Config struct {
	BrokerName string // default "broker-a"
	Cluster    string // default "DefaultCluster"
	// DefaultQueues is the number of queues of a topic created by a send
	// (auto-creation, capped by the request's defaultTopicQueueNums) or
	// by CreateTopic with 0. Default 4.
	DefaultQueues int
	// NoAutoCreate refuses sends to unknown topics with TOPIC_NOT_EXIST
	// (autoCreateTopicEnable=false).
	NoAutoCreate bool
	// DelayLevels is the broker's messageDelayLevel. Default
	// DefaultDelayLevels.
	DelayLevels []time.Duration
	// MaxMessageSize bounds a message body. Default 4 MiB.
	MaxMessageSize int
	// MaxPullBytes bounds the bodies of one pull response (at least one
	// message is returned). Default 256 KiB.
	MaxPullBytes int
	// LockExpiry is how long a queue lock (orderly consumption) lasts
	// without renewal. Default 60s.
	LockExpiry time.Duration
	// ClientExpiry is how long a client may go without a heartbeat before
	// it is removed from its groups. Default 120s.
	ClientExpiry time.Duration
	// RetryMaxTimes is the subscription groups' retryMaxTimes, used when
	// a request carries no maximum. Default 16.
	RetryMaxTimes int
	// OffsetUpdateDelay applies each UPDATE_CONSUMER_OFFSET this long
	// after it arrived (in arrival order, checked every 50ms), while the
	// broker's other requests are served at once: the Java broker runs
	// offset updates on an executor of their own, and the client sends
	// them one way, so a backlog there lets a query of the offsets from
	// another connection overtake them. Default 0: applied on arrival.
	OffsetUpdateDelay time.Duration
	// LoseMemberOffsetUpdates drops every UPDATE_CONSUMER_OFFSET that
	// arrives on the connection of one of the group's members (a client
	// that sent a heartbeat for it); updates from other connections are
	// applied. The client sends its updates one way (it never reads the
	// answer) and its Shutdown closes the connection right after sending
	// its last offsets: a broker that has not read them by then can lose
	// them (a write of a pull answer to the closed client fails and the
	// broker closes its end; this fake does that too, which lost the
	// offsets of brokertest's NoAckBeforeEffect in 1 of ~40 runs under
	// load). Default false.
	LoseMemberOffsetUpdates bool
	// Logger receives a debug line per request. Default: discard.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.BrokerName == "" {
		c.BrokerName = "broker-a"
	}
	if c.Cluster == "" {
		c.Cluster = "DefaultCluster"
	}
	if c.DefaultQueues <= 0 {
		c.DefaultQueues = 4
	}
	if len(c.DelayLevels) == 0 {
		c.DelayLevels = DefaultDelayLevels
	}
	if c.MaxMessageSize <= 0 {
		c.MaxMessageSize = 4 << 20
	}
	if c.MaxPullBytes <= 0 {
		c.MaxPullBytes = 256 << 10
	}
	if c.LockExpiry <= 0 {
		c.LockExpiry = 60 * time.Second
	}
	if c.ClientExpiry <= 0 {
		c.ClientExpiry = 120 * time.Second
	}
	if c.RetryMaxTimes <= 0 {
		c.RetryMaxTimes = 16
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Server is a running name server and broker.
type Server struct {
	cfg        Config
	ns, br     net.Listener
	brokerHost netip.AddrPort

	mu        sync.Mutex
	topics    map[string]*topic
	commitLog map[int64]*entry // by commit log offset
	physNext  int64
	scheduled []*entry
	offsets   map[string]map[queueKey]int64 // group -> queue -> committed offset
	groups    map[string]map[string]*member // group -> client id -> member
	locks     map[string]map[queueKey]*lock // group -> queue -> holder
	conns     map[*conn]bool
	requests  map[int]int
	pauseNS   bool
	// lateOffsets: offset updates waiting out OffsetUpdateDelay, oldest
	// first.
	lateOffsets []lateOffset

	closed    chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type lateOffset struct {
	due    time.Time
	group  string
	k      queueKey
	offset int64
}

type queueKey struct {
	topic string
	queue int
}

type topic struct {
	name   string
	perm   int
	queues []*queue
}

type queue struct {
	msgs []*entry
	wake chan struct{} // closed and replaced when a message is appended
}

// entry is one stored message.
type entry struct {
	remoting.Stored
	props map[string]string
	due   time.Time // scheduled messages: when they are delivered
}

type member struct {
	c      *conn
	lastHB time.Time
}

type lock struct {
	client  string
	renewed time.Time
}

// Start listens on two loopback ports (name server, broker) and serves
// until Close.
func Start(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	ns, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	br, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ns.Close()
		return nil, err
	}
	s := &Server{
		cfg: cfg, ns: ns, br: br,
		brokerHost: netip.MustParseAddrPort(br.Addr().String()),
		topics:     map[string]*topic{},
		commitLog:  map[int64]*entry{},
		offsets:    map[string]map[queueKey]int64{},
		groups:     map[string]map[string]*member{},
		locks:      map[string]map[queueKey]*lock{},
		conns:      map[*conn]bool{},
		requests:   map[int]int{},
		closed:     make(chan struct{}),
	}
	// The default topic auto-creation copies (TBW102) exists on every
	// broker with autoCreateTopicEnable.
	if !cfg.NoAutoCreate {
		s.topics["TBW102"] = newTopic("TBW102", 8, remoting.PermRead|remoting.PermWrite|remoting.PermInherit)
	}
	s.wg.Add(3)
	go s.accept(ns, true)
	go s.accept(br, false)
	go s.housekeeping()
	return s, nil
}

func newTopic(name string, queues, perm int) *topic {
	t := &topic{name: name, perm: perm}
	for range queues {
		t.queues = append(t.queues, &queue{wake: make(chan struct{})})
	}
	return t
}

// NameServerAddr is the name server's host:port.
func (s *Server) NameServerAddr() string { return s.ns.Addr().String() }

// BrokerAddr is the broker's host:port.
func (s *Server) BrokerAddr() string { return s.br.Addr().String() }

// Close stops both servers, closes every connection and waits for the
// server's goroutines.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.ns.Close()
		s.br.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
	})
	s.wg.Wait()
	return nil
}

func (s *Server) accept(l net.Listener, nameServer bool) {
	defer s.wg.Done()
	for {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		c := &conn{s: s, nc: nc, nameServer: nameServer, done: make(chan struct{})}
		if ap, err := netip.ParseAddrPort(nc.RemoteAddr().String()); err == nil {
			c.remote = ap
		}
		s.mu.Lock()
		select {
		case <-s.closed:
			s.mu.Unlock()
			nc.Close()
			return
		default:
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go c.serve()
	}
}

// housekeeping delivers scheduled messages when due and removes clients
// whose heartbeats stopped.
func (s *Server) housekeeping() {
	defer s.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return
		case now := <-t.C:
			s.mu.Lock()
			s.deliverDue(now)
			s.applyLateOffsets(now)
			for g, ms := range s.groups {
				changed := false
				for id, m := range ms {
					if now.Sub(m.lastHB) > s.cfg.ClientExpiry {
						delete(ms, id)
						changed = true
					}
				}
				if changed {
					s.notifyLocked(g)
				}
			}
			s.mu.Unlock()
		}
	}
}

// conn is one accepted connection.
type conn struct {
	s          *Server
	nc         net.Conn
	nameServer bool
	remote     netip.AddrPort
	wmu        sync.Mutex
	done       chan struct{}

	// Under s.mu:
	clientID string
	groups   map[string]bool
}

func (c *conn) serve() {
	defer c.s.wg.Done()
	defer close(c.done)
	r := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		req, err := remoting.ReadFrame(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.s.cfg.Logger.Debug("fakerocket: read", "remote", c.remote, "err", err)
			}
			break
		}
		if req.IsResponse() {
			continue // answers to our notifications (none expected)
		}
		c.s.mu.Lock()
		c.s.requests[req.Code]++
		c.s.mu.Unlock()
		c.s.cfg.Logger.Debug("fakerocket: request", "code", req.Code, "ext", req.ExtFields, "remote", c.remote)
		if req.Code == remoting.PullMessage && !c.nameServer {
			// Pulls may wait (long polling): off the read loop, so the
			// client's other requests on this connection go on.
			c.s.wg.Add(1)
			go func() {
				defer c.s.wg.Done()
				c.reply(req, c.s.pull(c, req))
			}()
			continue
		}
		var resp *remoting.Command
		if c.nameServer {
			resp = c.s.nameServerRequest(req)
		} else {
			resp = c.s.brokerRequest(c, req)
		}
		c.reply(req, resp)
	}
	c.nc.Close()
	c.s.connClosed(c)
}

func (c *conn) reply(req, resp *remoting.Command) {
	if resp == nil || req.IsOneway() {
		return
	}
	c.send(resp)
}

func (c *conn) send(cmd *remoting.Command) {
	b, err := remoting.Encode(cmd)
	if err != nil {
		c.s.cfg.Logger.Error("fakerocket: encode", "err", err)
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.nc.Write(b); err != nil {
		c.nc.Close()
	}
}

// connClosed removes the connection's client from its groups and tells
// the groups' other members.
func (s *Server) connClosed(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	for g := range c.groups {
		if m := s.groups[g][c.clientID]; m != nil && m.c == c {
			delete(s.groups[g], c.clientID)
			s.notifyLocked(g)
		}
	}
}

// notifyLocked sends NOTIFY_CONSUMER_IDS_CHANGED (one way) to every
// member of group.
func (s *Server) notifyLocked(group string) {
	for _, m := range s.groups[group] {
		cmd := &remoting.Command{Code: remoting.NotifyConsumerIdsChanged, Language: "JAVA", Version: remoting.ServerVersion,
			Flag: remoting.FlagOneway, ExtFields: map[string]string{"consumerGroup": group}}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			m.c.send(cmd)
		}()
	}
}

func ok(req *remoting.Command) *remoting.Command {
	return remoting.ResponseTo(req, remoting.Success, "")
}

func fail(req *remoting.Command, code int, format string, a ...any) *remoting.Command {
	return remoting.ResponseTo(req, code, fmt.Sprintf(format, a...))
}

func (s *Server) nameServerRequest(req *remoting.Command) *remoting.Command {
	switch req.Code {
	case remoting.GetRouteInfoByTopic:
		return s.route(req)
	case remoting.DeleteTopicInNamesrv:
		return ok(req) // routes come from the broker's topics
	}
	return fail(req, remoting.RequestCodeNotSupported, "request type %d not supported", req.Code)
}

// route answers GET_ROUTEINFO_BY_TOPIC with the broker's queues of the
// topic. Clients before 4.9.4 get what fastjson writes by default, a map
// with unquoted numeric keys ({0:"host:port"}), and parse it that way.
func (s *Server) route(req *remoting.Command) *remoting.Command {
	name := req.Field("topic")
	s.mu.Lock()
	t := s.topics[name]
	var queues, perm int
	if t != nil {
		queues, perm = len(t.queues), t.perm
	}
	paused := s.pauseNS
	s.mu.Unlock()
	if t == nil || paused {
		return fail(req, remoting.TopicNotExist, "No topic route info in name server for the topic: %s", name)
	}
	addrs := fmt.Sprintf(`{"0":%q}`, s.BrokerAddr())
	if req.Version < 401 { // MQVersion.Version.V4_9_4
		addrs = fmt.Sprintf(`{0:%q}`, s.BrokerAddr())
	}
	body := fmt.Sprintf(`{"brokerDatas":[{"brokerAddrs":%s,"brokerName":%q,"cluster":%q}],"filterServerTable":{},`+
		`"queueDatas":[{"brokerName":%q,"perm":%d,"readQueueNums":%d,"topicSysFlag":0,"writeQueueNums":%d}]}`,
		addrs, s.cfg.BrokerName, s.cfg.Cluster, s.cfg.BrokerName, perm, queues, queues)
	resp := ok(req)
	resp.Body = []byte(body)
	return resp
}

func (s *Server) brokerRequest(c *conn, req *remoting.Command) *remoting.Command {
	switch req.Code {
	case remoting.HeartBeat:
		return s.heartbeat(c, req)
	case remoting.UnregisterClient:
		return s.unregister(c, req)
	case remoting.SendMessage, remoting.SendMessageV2, remoting.SendBatchMessage:
		return s.send(c, req)
	case remoting.QueryConsumerOffset:
		return s.queryOffset(req)
	case remoting.UpdateConsumerOffset:
		group, k, off := req.Field("consumerGroup"), queueKey{req.Field("topic"), int(req.Int("queueId", 0))}, req.Int("commitOffset", 0)
		s.mu.Lock()
		if s.cfg.LoseMemberOffsetUpdates && c.groups[group] {
			s.mu.Unlock()
			return ok(req) // the client does not wait for the answer
		}
		if s.cfg.OffsetUpdateDelay > 0 {
			s.lateOffsets = append(s.lateOffsets, lateOffset{time.Now().Add(s.cfg.OffsetUpdateDelay), group, k, off})
		} else {
			s.commitLocked(group, k, off)
		}
		s.mu.Unlock()
		return ok(req)
	case remoting.GetMaxOffset, remoting.GetMinOffset, remoting.SearchOffsetByTimestamp:
		return s.offsetQuery(req)
	case remoting.GetConsumerListByGroup:
		return s.consumerList(req)
	case remoting.ConsumerSendMsgBack:
		return s.sendBack(req)
	case remoting.LockBatchMQ, remoting.UnlockBatchMQ:
		return s.lockBatch(req)
	case remoting.UpdateAndCreateTopic:
		name := req.Field("topic")
		if err := checkTopic(name); err != nil {
			return fail(req, remoting.SystemError, "%v", err)
		}
		n := int(req.Int("writeQueueNums", int64(s.cfg.DefaultQueues)))
		if r := int(req.Int("readQueueNums", int64(n))); r > n {
			n = r
		}
		s.CreateTopic(name, n)
		s.mu.Lock()
		if p := int(req.Int("perm", 0)); p > 0 {
			s.topics[name].perm = p
		}
		s.mu.Unlock()
		return ok(req)
	case remoting.DeleteTopicInBroker:
		s.DeleteTopic(req.Field("topic"))
		return ok(req)
	}
	return fail(req, remoting.RequestCodeNotSupported, "request type %d not supported", req.Code)
}

// heartbeatData is the part of a heartbeat body the broker uses.
type heartbeatData struct {
	ClientID        string `json:"clientID"`
	ConsumerDataSet []struct {
		GroupName    string `json:"groupName"`
		MessageModel string `json:"messageModel"`
	} `json:"consumerDataSet"`
}

func (s *Server) heartbeat(c *conn, req *remoting.Command) *remoting.Command {
	var hb heartbeatData
	if err := json.Unmarshal(req.Body, &hb); err != nil || hb.ClientID == "" {
		return fail(req, remoting.SystemError, "bad heartbeat: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c.clientID = hb.ClientID
	if c.groups == nil {
		c.groups = map[string]bool{}
	}
	now := time.Now()
	for _, cd := range hb.ConsumerDataSet {
		g := cd.GroupName
		if g == "" {
			continue
		}
		if s.topics[remoting.RetryTopic(g)] == nil {
			s.topics[remoting.RetryTopic(g)] = newTopic(remoting.RetryTopic(g), 1, remoting.PermRead|remoting.PermWrite)
		}
		ms := s.groups[g]
		if ms == nil {
			ms = map[string]*member{}
			s.groups[g] = ms
		}
		m := ms[hb.ClientID]
		c.groups[g] = true
		if m != nil && m.c == c {
			m.lastHB = now
			continue
		}
		ms[hb.ClientID] = &member{c: c, lastHB: now}
		s.notifyLocked(g)
	}
	return ok(req)
}

func (s *Server) unregister(c *conn, req *remoting.Command) *remoting.Command {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, g := req.Field("clientID"), req.Field("consumerGroup")
	if m := s.groups[g][id]; m != nil {
		delete(s.groups[g], id)
		s.notifyLocked(g)
	}
	return ok(req)
}

func (s *Server) consumerList(req *remoting.Command) *remoting.Command {
	g := req.Field("consumerGroup")
	s.mu.Lock()
	ids := slices.Sorted(maps.Keys(s.groups[g]))
	s.mu.Unlock()
	if len(ids) == 0 {
		return fail(req, remoting.SystemError, "no consumer for this group, %s", g)
	}
	b, _ := json.Marshal(struct {
		ConsumerIDList []string `json:"consumerIdList"`
	}{ids})
	resp := ok(req)
	resp.Body = b
	return resp
}

// checkTopic applies the broker's topic name rules.
func checkTopic(name string) error { return remoting.CheckName(name) }

// sendHeader is a SEND_MESSAGE header, from its long (SEND_MESSAGE) or
// one-letter (V2, batch) field names.
type sendHeader struct {
	group, topic, defaultTopic string
	defaultQueues, queueID     int
	sysFlag, flag              int32
	bornTimestamp              int64
	properties                 string
	reconsumeTimes             int
	maxReconsumeTimes          int // -1: not given
	batch                      bool
}

func parseSendHeader(req *remoting.Command) sendHeader {
	f := func(long, short string) string {
		if req.Code == remoting.SendMessage {
			return req.Field(long)
		}
		return req.Field(short)
	}
	n := func(long, short string, def int64) int64 {
		v, err := strconv.ParseInt(f(long, short), 10, 64)
		if err != nil {
			return def
		}
		return v
	}
	return sendHeader{
		group: f("producerGroup", "a"), topic: f("topic", "b"), defaultTopic: f("defaultTopic", "c"),
		defaultQueues: int(n("defaultTopicQueueNums", "d", 4)), queueID: int(n("queueId", "e", -1)),
		sysFlag: int32(n("sysFlag", "f", 0)), bornTimestamp: n("bornTimestamp", "g", 0), flag: int32(n("flag", "h", 0)),
		properties: f("properties", "i"), reconsumeTimes: int(n("reconsumeTimes", "j", 0)),
		maxReconsumeTimes: int(n("maxReconsumeTimes", "l", -1)), batch: f("batch", "m") == "true" || req.Code == remoting.SendBatchMessage,
	}
}

func (s *Server) send(c *conn, req *remoting.Command) *remoting.Command {
	h := parseSendHeader(req)
	if err := checkTopic(h.topic); err != nil {
		return fail(req, remoting.MessageIllegal, "%v", err)
	}
	if h.topic == "TBW102" {
		return fail(req, remoting.MessageIllegal, "the topic[TBW102] is conflict with system reserved words")
	}
	type one struct {
		body  []byte
		flag  int32
		props map[string]string
	}
	var msgs []one
	if h.batch {
		if strings.HasPrefix(h.topic, remoting.RetryTopicPrefix) {
			return fail(req, remoting.MessageIllegal, "batch request does not support retry group %s", h.topic)
		}
		bs, err := remoting.DecodeBatched(req.Body)
		if err != nil || len(bs) == 0 {
			return fail(req, remoting.MessageIllegal, "bad batch body: %v", err)
		}
		for _, b := range bs {
			p := remoting.DecodeProperties(b.Properties)
			if p[remoting.PropertyDelayLevel] != "" && p[remoting.PropertyDelayLevel] != "0" {
				return fail(req, remoting.MessageIllegal, "batch messages do not support delay levels")
			}
			msgs = append(msgs, one{b.Body, b.Flag, p})
		}
	} else {
		msgs = append(msgs, one{req.Body, h.flag, remoting.DecodeProperties(h.properties)})
	}
	for _, m := range msgs {
		if len(m.body) > s.cfg.MaxMessageSize {
			return fail(req, remoting.MessageIllegal, "the message body size over max value, MAX: %d", s.cfg.MaxMessageSize)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[h.topic]
	if t == nil && strings.HasPrefix(h.topic, remoting.RetryTopicPrefix) {
		t = newTopic(h.topic, 1, remoting.PermRead|remoting.PermWrite)
		s.topics[h.topic] = t
	}
	if t == nil {
		if s.cfg.NoAutoCreate || s.topics[h.defaultTopic] == nil {
			return fail(req, remoting.TopicNotExist, "topic[%s] not exist, apply first please!", h.topic)
		}
		t = newTopic(h.topic, max(1, min(h.defaultQueues, s.cfg.DefaultQueues)), remoting.PermRead|remoting.PermWrite)
		s.topics[h.topic] = t
	}
	if t.perm&remoting.PermWrite == 0 {
		return fail(req, remoting.NoPermission, "the topic[%s] sending message is forbidden", h.topic)
	}
	qid := h.queueID
	if qid < 0 {
		qid = int(s.physNext) % len(t.queues)
	}
	if qid >= len(t.queues) {
		return fail(req, remoting.SystemError, "request queueId[%d] is illegal, %s", qid, h.topic)
	}
	topicName := h.topic
	if strings.HasPrefix(topicName, remoting.RetryTopicPrefix) {
		// A retry message sent as a normal one (the client's fallback
		// when CONSUMER_SEND_MSG_BACK fails): past its maximum it goes to
		// the group's dead-letter topic.
		maxTimes := h.maxReconsumeTimes
		if maxTimes < 0 {
			maxTimes = s.cfg.RetryMaxTimes
		}
		if h.reconsumeTimes >= maxTimes {
			topicName = remoting.DLQTopic(strings.TrimPrefix(topicName, remoting.RetryTopicPrefix))
			qid = 0
			delete(msgs[0].props, remoting.PropertyDelayLevel)
		}
	}
	now := time.Now()
	var ids []string
	var first *entry
	for _, m := range msgs {
		m.props[remoting.PropertyCluster] = s.cfg.Cluster
		e := &entry{props: m.props}
		e.Topic, e.QueueID, e.Flag, e.SysFlag = topicName, int32(qid), m.flag, h.sysFlag
		e.BornTimestamp, e.BornHost, e.StoreHost = h.bornTimestamp, c.remote, s.brokerHost
		e.ReconsumeTimes = int32(h.reconsumeTimes)
		e.Body = m.body
		s.putLocked(e, now)
		ids = append(ids, e.OffsetMsgID())
		if first == nil {
			first = e
		}
	}
	resp := ok(req)
	resp.ExtFields["msgId"] = strings.Join(ids, ",")
	resp.ExtFields["queueId"] = strconv.Itoa(int(first.QueueID))
	resp.ExtFields["queueOffset"] = strconv.FormatInt(first.QueueOffset, 10)
	resp.ExtFields["MSG_REGION"] = "DefaultRegion"
	resp.ExtFields["TRACE_ON"] = "true"
	return resp
}

// putLocked stores e: into its topic's queue, or, with a delay level, into
// the schedule (as the Java store does through SCHEDULE_TOPIC_XXXX, with
// REAL_TOPIC and REAL_QID).
func (s *Server) putLocked(e *entry, now time.Time) {
	e.StoreTimestamp = now.UnixMilli()
	e.CommitLogOffset = s.physNext
	level, _ := strconv.Atoi(e.props[remoting.PropertyDelayLevel])
	if level > 0 && !strings.HasPrefix(e.Topic, remoting.DLQTopicPrefix) {
		level = min(level, len(s.cfg.DelayLevels))
		e.props[remoting.PropertyDelayLevel] = strconv.Itoa(level)
		e.props[remoting.PropertyRealTopic] = e.Topic
		e.props[remoting.PropertyRealQueueID] = strconv.Itoa(int(e.QueueID))
		e.due = now.Add(s.cfg.DelayLevels[level-1])
		e.Properties = remoting.EncodeProperties(e.props)
		s.physNext += int64(storedSize(e))
		s.scheduled = append(s.scheduled, e)
		return
	}
	e.Properties = remoting.EncodeProperties(e.props)
	t := s.topics[e.Topic]
	if t == nil {
		t = newTopic(e.Topic, 1, remoting.PermRead|remoting.PermWrite)
		s.topics[e.Topic] = t
	}
	q := t.queues[int(e.QueueID)%len(t.queues)]
	e.QueueOffset = int64(len(q.msgs))
	q.msgs = append(q.msgs, e)
	s.commitLog[e.CommitLogOffset] = e
	s.physNext += int64(storedSize(e))
	close(q.wake)
	q.wake = make(chan struct{})
}

func storedSize(e *entry) int {
	b, err := remoting.AppendStored(nil, &e.Stored)
	if err != nil {
		return 256
	}
	return len(b)
}

// deliverDue moves scheduled messages whose time has come to their real
// topic, in schedule order, without their delay level.
func (s *Server) deliverDue(now time.Time) {
	kept := s.scheduled[:0]
	for _, e := range s.scheduled {
		if now.Before(e.due) {
			kept = append(kept, e)
			continue
		}
		d := &entry{props: maps.Clone(e.props)}
		d.Stored = e.Stored
		delete(d.props, remoting.PropertyDelayLevel)
		d.Topic = e.props[remoting.PropertyRealTopic]
		q, _ := strconv.Atoi(e.props[remoting.PropertyRealQueueID])
		d.QueueID = int32(q)
		s.putLocked(d, now)
	}
	clear(s.scheduled[len(kept):])
	s.scheduled = kept
}

// applyLateOffsets commits the offset updates due by now, in order.
func (s *Server) applyLateOffsets(now time.Time) {
	n := 0
	for n < len(s.lateOffsets) && !s.lateOffsets[n].due.After(now) {
		u := s.lateOffsets[n]
		s.commitLocked(u.group, u.k, u.offset)
		n++
	}
	s.lateOffsets = s.lateOffsets[n:]
}

func (s *Server) commitLocked(group string, k queueKey, offset int64) {
	if group == "" {
		return
	}
	m := s.offsets[group]
	if m == nil {
		m = map[queueKey]int64{}
		s.offsets[group] = m
	}
	m[k] = offset
}

func (s *Server) queryOffset(req *remoting.Command) *remoting.Command {
	k := queueKey{req.Field("topic"), int(req.Int("queueId", 0))}
	s.mu.Lock()
	off, found := s.offsets[req.Field("consumerGroup")][k]
	s.mu.Unlock()
	if !found {
		// Nothing committed: the Java broker answers 0 while the
		// queue's first message is still in memory (minOffset 0), which
		// here it always is.
		off = 0
	}
	resp := ok(req)
	resp.ExtFields["offset"] = strconv.FormatInt(off, 10)
	return resp
}

func (s *Server) offsetQuery(req *remoting.Command) *remoting.Command {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[req.Field("topic")]
	qid := int(req.Int("queueId", 0))
	if t == nil || qid < 0 || qid >= len(t.queues) {
		return fail(req, remoting.SystemError, "no such queue %s/%d", req.Field("topic"), qid)
	}
	q := t.queues[qid]
	var off int64
	switch req.Code {
	case remoting.GetMaxOffset:
		off = int64(len(q.msgs))
	case remoting.GetMinOffset:
		off = 0
	case remoting.SearchOffsetByTimestamp:
		ts := req.Int("timestamp", 0)
		off = int64(len(q.msgs))
		for i, e := range q.msgs {
			if e.StoreTimestamp >= ts {
				off = int64(i)
				break
			}
		}
	}
	resp := ok(req)
	resp.ExtFields["offset"] = strconv.FormatInt(off, 10)
	return resp
}

// pull answers PULL_MESSAGE: the messages from queueOffset on (at most
// maxMsgNums and MaxPullBytes), or, when there are none and the request
// allows suspending, waits for one until the suspend timeout.
func (s *Server) pull(c *conn, req *remoting.Command) *remoting.Command {
	group, name := req.Field("consumerGroup"), req.Field("topic")
	qid := int(req.Int("queueId", 0))
	offset := req.Int("queueOffset", 0)
	maxN := int(req.Int("maxMsgNums", 32))
	sys := req.Int("sysFlag", 0)
	suspend := time.Duration(req.Int("suspendTimeoutMillis", 0)) * time.Millisecond
	allowSuspend := sys&2 != 0
	if sys&1 != 0 {
		s.mu.Lock()
		s.commitLocked(group, queueKey{name, qid}, req.Int("commitOffset", 0))
		s.mu.Unlock()
	}
	for {
		s.mu.Lock()
		t := s.topics[name]
		if t == nil {
			s.mu.Unlock()
			return fail(req, remoting.TopicNotExist, "topic[%s] not exist, apply first please!", name)
		}
		if t.perm&remoting.PermRead == 0 {
			s.mu.Unlock()
			return fail(req, remoting.NoPermission, "the topic[%s] pulling message is forbidden", name)
		}
		if qid < 0 || qid >= len(t.queues) {
			s.mu.Unlock()
			return fail(req, remoting.SystemError, "queueId[%d] is illegal, topic:[%s] topicConfig.readQueueNums:[%d]", qid, name, len(t.queues))
		}
		q := t.queues[qid]
		maxOff := int64(len(q.msgs))
		resp := ok(req)
		resp.ExtFields["suggestWhichBrokerId"] = "0"
		resp.ExtFields["minOffset"] = "0"
		resp.ExtFields["maxOffset"] = strconv.FormatInt(maxOff, 10)
		switch {
		case offset < 0 || offset > maxOff:
			s.mu.Unlock()
			next := min(max(offset, 0), maxOff)
			resp.Code, resp.Remark = remoting.PullOffsetMoved, "OFFSET_OVERFLOW_BADLY or OFFSET_TOO_SMALL"
			resp.ExtFields["nextBeginOffset"] = strconv.FormatInt(next, 10)
			return resp
		case offset < maxOff:
			var body []byte
			n := 0
			for i := offset; i < maxOff && n < maxN && (n == 0 || len(body) < s.cfg.MaxPullBytes); i++ {
				b, err := remoting.AppendStored(body, &q.msgs[i].Stored)
				if err != nil {
					break
				}
				body = b
				n++
			}
			s.mu.Unlock()
			resp.Body = body
			resp.ExtFields["nextBeginOffset"] = strconv.FormatInt(offset+int64(n), 10)
			return resp
		}
		wake := q.wake
		s.mu.Unlock()
		if !allowSuspend || suspend <= 0 {
			resp.Code, resp.Remark = remoting.PullNotFound, "OFFSET_OVERFLOW_ONE"
			resp.ExtFields["nextBeginOffset"] = strconv.FormatInt(offset, 10)
			return resp
		}
		timer := time.NewTimer(suspend)
		select {
		case <-wake:
		case <-timer.C:
		case <-c.done:
		case <-s.closed:
		}
		timer.Stop()
		allowSuspend = false
	}
}

// sendBack handles CONSUMER_SEND_MSG_BACK as the Java broker does: the
// message at the commit log offset is copied to %RETRY%group with
// reconsume times + 1 and a delay level (3 + reconsume times when 0), or
// to %DLQ%group when its reconsume times reached the maximum or the level
// is negative; RETRY_TOPIC and ORIGIN_MESSAGE_ID are kept from the first
// send-back.
func (s *Server) sendBack(req *remoting.Command) *remoting.Command {
	group := req.Field("group")
	if group == "" {
		return fail(req, remoting.SystemError, "no group")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	orig := s.commitLog[req.Int("offset", -1)]
	if orig == nil {
		return fail(req, remoting.SystemError, "look message by offset failed, %s", req.Field("offset"))
	}
	retry := remoting.RetryTopic(group)
	if s.topics[retry] == nil {
		s.topics[retry] = newTopic(retry, 1, remoting.PermRead|remoting.PermWrite)
	}
	props := maps.Clone(orig.props)
	if props[remoting.PropertyRetryTopic] == "" {
		props[remoting.PropertyRetryTopic] = orig.Topic
	}
	if props[remoting.PropertyOriginMessageID] == "" {
		props[remoting.PropertyOriginMessageID] = orig.OffsetMsgID()
	}
	maxTimes := int(req.Int("maxReconsumeTimes", int64(s.cfg.RetryMaxTimes)))
	level := int(req.Int("delayLevel", 0))
	e := &entry{props: props}
	e.Stored = orig.Stored
	e.Topic, e.QueueID = retry, 0
	if int(orig.ReconsumeTimes) >= maxTimes || level < 0 {
		e.Topic = remoting.DLQTopic(group)
		if s.topics[e.Topic] == nil {
			s.topics[e.Topic] = newTopic(e.Topic, 1, remoting.PermRead|remoting.PermWrite)
		}
		delete(props, remoting.PropertyDelayLevel)
	} else {
		if level == 0 {
			level = 3 + int(orig.ReconsumeTimes)
		}
		props[remoting.PropertyDelayLevel] = strconv.Itoa(level)
	}
	delete(props, remoting.PropertyRealTopic)
	delete(props, remoting.PropertyRealQueueID)
	e.ReconsumeTimes = orig.ReconsumeTimes + 1
	s.putLocked(e, time.Now())
	return ok(req)
}

type mqJSON struct {
	Topic      string `json:"topic"`
	BrokerName string `json:"brokerName"`
	QueueID    int    `json:"queueId"`
}

func (s *Server) lockBatch(req *remoting.Command) *remoting.Command {
	var body struct {
		ConsumerGroup string   `json:"consumerGroup"`
		ClientID      string   `json:"clientId"`
		MQSet         []mqJSON `json:"mqSet"`
	}
	if err := json.Unmarshal(req.Body, &body); err != nil {
		return fail(req, remoting.SystemError, "bad lock body: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.locks[body.ConsumerGroup]
	if ls == nil {
		ls = map[queueKey]*lock{}
		s.locks[body.ConsumerGroup] = ls
	}
	now := time.Now()
	locked := []mqJSON{}
	for _, mq := range body.MQSet {
		k := queueKey{mq.Topic, mq.QueueID}
		l := ls[k]
		if req.Code == remoting.UnlockBatchMQ {
			if l != nil && l.client == body.ClientID {
				delete(ls, k)
			}
			continue
		}
		if l == nil || l.client == body.ClientID || now.Sub(l.renewed) > s.cfg.LockExpiry {
			ls[k] = &lock{client: body.ClientID, renewed: now}
			locked = append(locked, mq)
		}
	}
	resp := ok(req)
	if req.Code == remoting.LockBatchMQ {
		resp.Body, _ = json.Marshal(struct {
			LockOKMQSet []mqJSON `json:"lockOKMQSet"`
		}{locked})
	}
	return resp
}
