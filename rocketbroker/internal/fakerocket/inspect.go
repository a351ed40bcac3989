package fakerocket

import (
	"bytes"
	"compress/zlib"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
)

// Message is a stored message as tests see it.
type Message struct {
	Topic          string
	Queue          int
	Offset         int64
	Body           []byte // decompressed
	Properties     map[string]string
	ReconsumeTimes int
	BornTimestamp  time.Time
}

// CreateTopic creates topic with queues read and write queues (0: the
// default number), or leaves it as it is if it exists.
func (s *Server) CreateTopic(topic string, queues int) {
	if queues <= 0 {
		queues = s.cfg.DefaultQueues
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.topics[topic] == nil {
		s.topics[topic] = newTopic(topic, queues, remoting.PermRead|remoting.PermWrite)
	}
}

// DeleteTopic removes topic, its messages and the offsets committed for it.
func (s *Server) DeleteTopic(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[topic]
	if t == nil {
		return
	}
	for _, q := range t.queues {
		for _, e := range q.msgs {
			delete(s.commitLog, e.CommitLogOffset)
		}
		close(q.wake)
	}
	delete(s.topics, topic)
	for _, m := range s.offsets {
		for k := range m {
			if k.topic == topic {
				delete(m, k)
			}
		}
	}
}

// Messages returns every message stored in topic, queue by queue in
// offset order (scheduled messages are not in their topic until due).
func (s *Server) Messages(topic string) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[topic]
	if t == nil {
		return nil
	}
	var out []Message
	for qi, q := range t.queues {
		for _, e := range q.msgs {
			out = append(out, toMessage(e, qi))
		}
	}
	return out
}

func toMessage(e *entry, qi int) Message {
	body := e.Body
	if e.SysFlag&remoting.SysFlagCompressed != 0 {
		if r, err := zlib.NewReader(bytes.NewReader(body)); err == nil {
			if b, err := io.ReadAll(r); err == nil {
				body = b
			}
		}
	}
	return Message{Topic: e.Topic, Queue: qi, Offset: e.QueueOffset, Body: body, Properties: maps.Clone(e.props),
		ReconsumeTimes: int(e.ReconsumeTimes), BornTimestamp: time.UnixMilli(e.BornTimestamp)}
}

// Scheduled returns the messages waiting for their delay level to pass
// whose real topic is topic.
func (s *Server) Scheduled(topic string) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Message
	for _, e := range s.scheduled {
		if e.props[remoting.PropertyRealTopic] == topic {
			out = append(out, toMessage(e, int(e.QueueID)))
		}
	}
	return out
}

// Backlog is how many messages of topic group has not committed: the sum
// over the queues of the max offset minus the committed offset (0 where
// none is).
func (s *Server) Backlog(group, topic string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[topic]
	if t == nil {
		return 0
	}
	var n int64
	for qi, q := range t.queues {
		n += int64(len(q.msgs)) - s.offsets[group][queueKey{topic, qi}]
	}
	return n
}

// Clients lists the client ids registered in group.
func (s *Server) Clients(group string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.groups[group]))
}

// Requests is how many requests with code the servers have received.
func (s *Server) Requests(code int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[code]
}

// Topics lists the topics the broker has, sorted.
func (s *Server) Topics() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.topics))
}

// DropConnections closes every connection to the broker and name server
// whose remote address contains match ("" for all), as a network cut
// would; the clients reconnect. It returns how many it closed.
func (s *Server) DropConnections(match string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if strings.Contains(c.remote.String(), match) {
			c.nc.Close()
			n++
		}
	}
	return n
}

// HideRoutes makes the name server answer TOPIC_NOT_EXIST for every topic
// while on (a name server that lost its routes); existing connections to
// the broker keep working.
func (s *Server) HideRoutes(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pauseNS = on
}
