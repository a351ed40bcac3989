package rocketbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
)

// Lag implements broker.LagReporter: for every queue of the subscribed
// topics and of the group's retry topic, the queue's max offset minus the
// group's committed offset (0 where none is committed), summed. It asks
// the name server for the routes and each broker for the offsets (two
// requests per queue) over connections of its own. Approximate: the client
// commits offsets every 5s, so up to 5s of consumed messages still count;
// messages waiting out a nak's delay level on the broker (in its schedule
// topic) do not.
func (s *Subscriber) Lag(ctx context.Context) (int64, error) {
	return GroupLag(ctx, s.cfg.Client, s.cfg.Group, append(s.cfg.Topics[:len(s.cfg.Topics):len(s.cfg.Topics)], remoting.RetryTopic(s.cfg.Group))...)
}

// GroupLag is Lag for any group and topics: the sum over the topics'
// queues of max offset minus the group's committed offset. A topic
// without a route counts 0.
func GroupLag(ctx context.Context, c Client, group string, topics ...string) (int64, error) {
	var total int64
	conns := newConnCache(ctx)
	defer conns.close()
	dial := conns.dial
	for _, topic := range topics {
		route, err := lookupRoute(ctx, c, dial, topic)
		if err != nil {
			return 0, fmt.Errorf("rocketbroker: lag: route of %s: %w", topic, err)
		}
		for _, q := range route.queues {
			addr := route.brokers[q.BrokerName]
			if addr == "" {
				continue
			}
			bc, err := dial(addr)
			if err != nil {
				return 0, fmt.Errorf("rocketbroker: lag: broker %s: %w", addr, err)
			}
			for id := range q.ReadQueueNums {
				ext := map[string]string{"topic": topic, "queueId": strconv.Itoa(id), "bname": q.BrokerName}
				maxOff, err := offsetRequest(ctx, bc, remoting.GetMaxOffset, ext)
				if err != nil {
					return 0, err
				}
				ext["consumerGroup"] = group
				committed, err := offsetRequest(ctx, bc, remoting.QueryConsumerOffset, ext)
				if errors.Is(err, errNotFound) {
					committed = 0
				} else if err != nil {
					return 0, err
				}
				total += max(0, maxOff-committed)
			}
		}
	}
	return total, nil
}

var errNotFound = errors.New("not found")

// connCache keeps one connection per address for a run of requests.
type connCache struct {
	ctx   context.Context
	conns map[string]*remoting.Conn
}

func newConnCache(ctx context.Context) *connCache {
	return &connCache{ctx: ctx, conns: map[string]*remoting.Conn{}}
}

func (c *connCache) dial(addr string) (*remoting.Conn, error) {
	if cn := c.conns[addr]; cn != nil {
		return cn, nil
	}
	cn, err := remoting.Dial(c.ctx, addr)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cn
	return cn, nil
}

func (c *connCache) close() {
	for _, cn := range c.conns {
		cn.Close()
	}
}

func newRequest(code int, ext map[string]string) *remoting.Command {
	return &remoting.Command{Code: code, Language: "GO", Version: remoting.ServerVersion, ExtFields: ext}
}

func offsetRequest(ctx context.Context, c *remoting.Conn, code int, ext map[string]string) (int64, error) {
	resp, err := c.Invoke(ctx, newRequest(code, ext))
	if err != nil {
		return 0, fmt.Errorf("rocketbroker: request %d: %w", code, err)
	}
	switch resp.Code {
	case remoting.Success:
		return strconv.ParseInt(resp.Field("offset"), 10, 64)
	case remoting.QueryNotFound:
		return 0, errNotFound
	}
	return 0, fmt.Errorf("rocketbroker: request %d: code %d: %s", code, resp.Code, resp.Remark)
}

type topicRoute struct {
	queues  []queueData
	brokers map[string]string // broker name -> master address
}

type queueData struct {
	BrokerName    string `json:"brokerName"`
	ReadQueueNums int    `json:"readQueueNums"`
}

// lookupRoute asks the name servers, in turn, for topic's route (in the
// standard JSON of 4.9.4 and later: it says it is such a client). A topic
// without a route has no queues.
func lookupRoute(ctx context.Context, c Client, dial func(string) (*remoting.Conn, error), topic string) (*topicRoute, error) {
	var last error
	for _, ns := range c.NameServers {
		nc, err := dial(ns)
		if err != nil {
			last = err
			continue
		}
		resp, err := nc.Invoke(ctx, newRequest(remoting.GetRouteInfoByTopic, map[string]string{"topic": topic}))
		if err != nil {
			last = err
			continue
		}
		switch resp.Code {
		case remoting.TopicNotExist:
			return &topicRoute{}, nil
		case remoting.Success:
		default:
			return nil, fmt.Errorf("code %d: %s", resp.Code, resp.Remark)
		}
		var body struct {
			QueueDatas  []queueData `json:"queueDatas"`
			BrokerDatas []struct {
				BrokerName  string            `json:"brokerName"`
				BrokerAddrs map[string]string `json:"brokerAddrs"`
			} `json:"brokerDatas"`
		}
		if err := json.Unmarshal(resp.Body, &body); err != nil {
			return nil, fmt.Errorf("route body: %w", err)
		}
		r := &topicRoute{queues: body.QueueDatas, brokers: map[string]string{}}
		for _, b := range body.BrokerDatas {
			r.brokers[b.BrokerName] = b.BrokerAddrs["0"]
		}
		return r, nil
	}
	if last == nil {
		last = errors.New("no name server")
	}
	return nil, last
}

var _ broker.LagReporter = (*Subscriber)(nil)
