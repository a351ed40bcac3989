package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/rabbitbroker"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// brokerAdmin is the harness's side of the broker: topics, the
// dead-letter destination's contents, and whether the consumers' backlog
// is settled.
type brokerAdmin struct {
	*brokerConn
	bs BrokerSpec
	kc *kgo.Client
	ka *kadm.Client
	ss *streamsbroker.Subscriber // streams: never fetches; its Lag is the group's
}

func newBrokerAdmin(ctx context.Context, bs BrokerSpec) (*brokerAdmin, error) {
	b, err := openBroker(ctx, bs, quiet())
	if err != nil {
		return nil, err
	}
	a := &brokerAdmin{brokerConn: b, bs: bs}
	if bs.Kind == "kafka" {
		kc, err := kgo.NewClient(kgo.SeedBrokers(bs.Brokers...), kgo.RetryTimeout(30*time.Second))
		if err != nil {
			return nil, err
		}
		a.kc, a.ka = kc, kadm.NewClient(kc)
	}
	if bs.Kind == "streams" {
		ss, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: b.rc, Stream: bs.Topic, Group: bs.Group, Logger: quiet()})
		if err != nil {
			b.close()
			return nil, err
		}
		a.ss = ss
	}
	return a, nil
}

func (a *brokerAdmin) close() {
	if a.kc != nil {
		a.kc.Close()
	}
	a.brokerConn.close()
}

// setup makes the cell's stream (NATS: one stream holding the topic and
// the dead-letter subject) or topics (Kafka: 6 partitions each).
func (a *brokerAdmin) setup(ctx context.Context) error {
	switch a.kind {
	case "rabbit":
		// The work queue (and the adapter's dead-letter and delay
		// queues' exchange) and the queue the consumers' dead letters go
		// to, before anything is published.
		if err := rabbitbroker.Declare(ctx, rabbitSubConfig(a.bs, Timing{}, quiet())); err != nil {
			return err
		}
		return rabbitbroker.Declare(ctx, rabbitPoisonConfig(a.bs, quiet()))
	case "streams":
		// The group from the stream's start, as the subscribers would
		// make it at their first fetch; the dead-letter stream is made by
		// its first entry.
		return a.rc.XGroupCreateMkStream(ctx, a.bs.Topic, a.bs.Group, "0").Err()
	case "nats":
		_, err := a.js.CreateStream(ctx, jetstream.StreamConfig{Name: a.bs.Stream, Subjects: []string{a.bs.Topic, a.bs.DLQ},
			Storage: jetstream.FileStorage, Replicas: 1})
		return err
	}
	res, err := a.ka.CreateTopics(ctx, 6, 1, nil, a.bs.Topic, a.bs.DLQ)
	if err != nil {
		return err
	}
	return res.Error()
}

// deadLetters reads the whole dead-letter destination: original id ->
// copies.
func (a *brokerAdmin) deadLetters(ctx context.Context) (map[string]int, error) {
	out, _, err := a.deadLetterCopies(ctx)
	return out, err
}

// deadLetterCopies reads the whole dead-letter destination: original id
// -> copies, and original id -> the dead-letter messages' own ids (the
// consumer derives one id per message, so a republish of the same dead
// letter carries the same id), where the reader sees it as a header
// (Kafka, RabbitMQ; elsewhere the second map is empty).
func (a *brokerAdmin) deadLetterCopies(ctx context.Context) (map[string]int, map[string]map[string]bool, error) {
	out, ids := map[string]int{}, map[string]map[string]bool{}
	err := a.readDeadLetters(ctx, func(h func(string) string) {
		orig := h(consumer.HeaderOriginalID)
		out[orig]++
		if id := h(broker.HeaderMessageID); id != "" {
			if ids[orig] == nil {
				ids[orig] = map[string]bool{}
			}
			ids[orig][id] = true
		}
	})
	return out, ids, err
}

// deadLetterReasons reads the dead-letter destination: original id ->
// the reason it was dead-lettered.
func (a *brokerAdmin) deadLetterReasons(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := a.readDeadLetters(ctx, func(h func(string) string) { out[h(consumer.HeaderOriginalID)] = h(consumer.HeaderDeadLetterReason) })
	return out, err
}

// readDeadLetters calls each with a header getter for every message on the
// dead-letter destination, reading it to its end.
func (a *brokerAdmin) readDeadLetters(ctx context.Context, each func(header func(string) string)) error {
	switch a.kind {
	case "rabbit":
		// basic.get without ack until the queue is empty; closing the
		// connection puts them all back.
		return a.rabbit(func(ch *amqp.Channel) error {
			for {
				d, ok, err := ch.Get(rabbitPoisonConfig(a.bs, nil).Queue, false)
				if err != nil || !ok {
					return err
				}
				each(func(name string) string {
					v, _ := d.Headers[name].(string)
					return v
				})
			}
		})
	case "streams":
		start := "-"
		for {
			page, err := a.rc.XRangeN(ctx, a.bs.DLQ, start, "+", 1000).Result()
			if err != nil {
				return err
			}
			for _, e := range page {
				each(func(name string) string {
					v, _ := e.Values[streamsbroker.FieldHeaderPrefix+name].(string)
					return v
				})
			}
			if len(page) < 1000 {
				return nil
			}
			start = "(" + page[len(page)-1].ID
		}
	case "nats":
		c, err := a.js.OrderedConsumer(ctx, a.bs.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{a.bs.DLQ}})
		if err != nil {
			return err
		}
		// What the server has for the consumer now, without waiting for
		// a full batch (a Fetch of 500 waited out its 1 s MaxWait for the
		// few dead letters a cell has, then 1 s more to find the end),
		// until the consumer has nothing pending.
		for {
			batch, err := c.FetchNoWait(500)
			if err != nil {
				return err
			}
			n := 0
			for m := range batch.Messages() {
				each(m.Headers().Get)
				n++
			}
			if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			if n > 0 {
				continue
			}
			info, err := c.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumPending == 0 {
				return nil
			}
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	ends, err := a.ka.ListEndOffsets(ctx, a.bs.DLQ)
	if err != nil {
		return err
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(a.bs.Brokers...), kgo.ConsumeTopics(a.bs.DLQ),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reading %s: %w (%d partitions not read to the end)", a.bs.DLQ, err, len(want))
		}
		fs.EachRecord(func(r *kgo.Record) {
			each(func(name string) string {
				for _, h := range r.Headers {
					if h.Key == name {
						return string(h.Value)
					}
				}
				return ""
			})
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	return nil
}

// rabbit runs f on a channel of a new connection (the node may have been
// restarted since the last call), closed after.
func (a *brokerAdmin) rabbit(f func(*amqp.Channel) error) error {
	c, err := amqp.DialConfig(a.bs.URL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	return f(ch)
}

// dlqCount is how many messages the dead-letter destination holds.
func (a *brokerAdmin) dlqCount(ctx context.Context) (int, error) {
	switch a.kind {
	case "rabbit":
		n := 0
		err := a.rabbit(func(ch *amqp.Channel) error {
			q, err := ch.QueueDeclarePassive(rabbitPoisonConfig(a.bs, nil).Queue, true, false, false, false, nil)
			n = q.Messages
			return err
		})
		return n, err
	case "streams":
		n, err := a.rc.XLen(ctx, a.bs.DLQ).Result()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		return int(n), err
	case "nats":
		s, err := a.js.Stream(ctx, a.bs.Stream)
		if err != nil {
			return 0, err
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(a.bs.DLQ))
		if err != nil {
			return 0, err
		}
		return int(info.State.Subjects[a.bs.DLQ]), nil
	}
	ends, err := a.ka.ListEndOffsets(ctx, a.bs.DLQ)
	if err != nil {
		return 0, err
	}
	n := int64(0)
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return int(n), nil
}

// idle reports whether the consumers' group has nothing left: nothing
// pending or waiting for an ack (NATS), no lag (Kafka).
func (a *brokerAdmin) idle(ctx context.Context) (bool, string, error) {
	switch a.kind {
	case "rabbit":
		// Ready in the work queue and waiting in its delay queues (nak'ed
		// with a delay). Deliveries unacked by a live consumer are in its
		// counters (the drain requires none); a dead one's are requeued
		// when the broker sees its connection close.
		cfg := rabbitSubConfig(a.bs, Timing{}, nil)
		var ready, delayed, dead int
		err := a.rabbit(func(ch *amqp.Channel) error {
			q, err := ch.QueueDeclarePassive(cfg.Queue, true, false, false, false, nil)
			if err != nil {
				return err
			}
			ready = q.Messages
			if q, err := ch.QueueDeclarePassive(cfg.Queue+".dlq", true, false, false, false, nil); err == nil {
				dead = q.Messages
			}
			return nil
		})
		if err != nil {
			return false, "", err
		}
		for _, b := range rabbitbroker.DefaultDelayBuckets {
			// A delay queue not declared yet is a 404, which closes
			// the channel: one channel each.
			_ = a.rabbit(func(ch *amqp.Channel) error {
				q, err := ch.QueueDeclarePassive(cfg.DelayQueue(b), true, false, false, false, nil)
				delayed += q.Messages
				return err
			})
		}
		return ready+delayed == 0, fmt.Sprintf("%d ready, %d in delay queues, %d terminated into the adapter's dead-letter queue", ready, delayed, dead), nil
	case "streams":
		// Pending (delivered, not acked) plus unread entries; and what the
		// subscribers moved to their own dead-letter stream past
		// MaxDeliver (the check finds those lost: neither in the ledger
		// nor on the harness's dead-letter stream).
		lag, err := a.ss.Lag(ctx)
		if err != nil {
			return false, "", err
		}
		moved, err := a.rc.XLen(ctx, streamsbroker.DeadLetterStream(a.bs.Topic)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, "", err
		}
		return lag == 0, fmt.Sprintf("lag %d (pending + unread), %d moved past MaxDeliver", lag, moved), nil
	case "nats":
		c, err := a.js.Consumer(ctx, a.bs.Stream, a.bs.Group)
		if err != nil {
			return false, "", err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, "", err
		}
		return info.NumPending == 0 && info.NumAckPending == 0,
			fmt.Sprintf("%d pending, %d waiting for an ack, %d redelivered", info.NumPending, info.NumAckPending, info.NumRedelivered), nil
	}
	lags, err := a.ka.Lag(ctx, a.bs.Group)
	if err != nil {
		return false, "", err
	}
	l, ok := lags[a.bs.Group]
	if !ok {
		return false, "no group yet", nil
	}
	if l.Error() != nil {
		return false, "", l.Error()
	}
	total := l.Lag.Total()
	state := fmt.Sprintf("lag %d", total)
	if ds, err := a.ka.DescribeGroups(ctx, a.bs.Group); err == nil {
		if d, ok := ds[a.bs.Group]; ok {
			state += fmt.Sprintf(", group %s with %d members", d.State, len(d.Members))
		}
	}
	return total == 0, state, nil
}
