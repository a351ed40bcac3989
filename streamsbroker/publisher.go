package streamsbroker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/internal/redisx/rediserr"
	"github.com/idem-dev/idem/internal/redisx/script"
	"github.com/redis/go-redis/v9"
)

// Publisher adds messages to streams with XADD (Message.Topic is the
// stream's key), each in one script that also records its id for the
// dedup window and enforces MaxLen. A message without a traceparent gets
// the trace context of ctx (broker.InjectTrace).
type Publisher struct {
	cfg    PublisherConfig
	window string // dedup window in ms, "0" for none
	maxLen string
	closed atomic.Bool
}

// NewPublisher returns a Publisher. It does not contact Redis: a Redis
// that is down at start fails the Publish calls, not the constructor.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Publisher{cfg: cfg, window: "0", maxLen: strconv.FormatInt(cfg.MaxLen, 10)}
	if !cfg.NoDedup {
		p.window = strconv.FormatInt(cfg.DedupWindow.Milliseconds(), 10)
	}
	return p, nil
}

type pubCall struct {
	m    *broker.Message
	keys []string
	args []any
	cmd  *redis.Cmd
}

func (p *Publisher) call(ctx context.Context, m *broker.Message) (*pubCall, error) {
	if m.ID == "" {
		return nil, fmt.Errorf("%w: streamsbroker: message without ID (ids are fixed by the producer)", idem.ErrInvalidArgument)
	}
	prefix, err := slotPrefix(m.Topic)
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", m.ID, err)
	}
	if len(m.Headers) > maxHeaders {
		return nil, fmt.Errorf("%w: streamsbroker: message %s has %d headers, the limit is %d", idem.ErrInvalidArgument, m.ID, len(m.Headers), maxHeaders)
	}
	m = broker.InjectTrace(ctx, m)
	c := &pubCall{m: m, keys: []string{m.Topic}}
	if p.window != "0" {
		c.keys = append(c.keys, dedupKey(prefix, m.ID))
	}
	c.args = append([]any{p.window, p.maxLen}, encode(m)...)
	return c, nil
}

// Publish adds msgs and returns once Redis has answered for every one (one
// round trip for a batch: a pipeline, split per node on a cluster), or the
// first error. A message whose id is in its stream's dedup window counts as
// published: the first copy is there. An error means some messages may not
// have been added: a lost reply is idem.ErrUnknownOutcome, Redis
// unreachable idem.ErrUnavailable, a full stream ErrStreamFull, an invalid
// message (no ID, bad stream name, too many headers) broker.ErrRejected
// and idem.ErrInvalidArgument (nothing sent). Publishing
// the same ids again is safe within DedupWindow (and the consumer's guard
// drops a duplicate beyond it).
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	calls := make([]*pubCall, len(msgs))
	for i, m := range msgs {
		c, err := p.call(ctx, m)
		if err != nil {
			// The message itself is invalid: refused again on every try.
			return fmt.Errorf("%w: %w", broker.ErrRejected, err)
		}
		calls[i] = c
	}
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = publishScript.Run(ctx, p.cfg.Client, c.keys, c.args...)
		return p.result(ctx, c)
	}
	pending := calls
	for attempt := 0; len(pending) > 0; attempt++ {
		pipe := p.cfg.Client.Pipeline()
		for _, c := range pending {
			if attempt == 0 {
				c.cmd = publishScript.EvalSha(ctx, pipe, c.keys, c.args...)
			} else {
				c.cmd = publishScript.Eval(ctx, pipe, c.keys, c.args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		var again []*pubCall
		for _, c := range pending {
			if attempt == 0 && script.NoScript(c.cmd.Err()) {
				again = append(again, c) // not run: send the source
			}
		}
		pending = again
	}
	failed := 0
	var first error
	for _, c := range calls {
		if err := p.result(ctx, c); err != nil {
			if first == nil {
				first = err
			}
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d messages not confirmed: %w", failed, len(calls), first)
	}
	return nil
}

func (p *Publisher) result(ctx context.Context, c *pubCall) error {
	err := c.cmd.Err()
	if err == nil {
		return nil
	}
	if strings.HasPrefix(err.Error(), "IDEMFULL") {
		return fmt.Errorf("%w: publish %s to %s: %s", ErrStreamFull, c.m.ID, c.m.Topic, strings.TrimPrefix(err.Error(), "IDEMFULL "))
	}
	return rediserr.Map(ctx, err, "streamsbroker: publish "+c.m.ID+" to "+c.m.Topic, true)
}

// Close stops the publisher; the client stays open (the caller owns it).
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}

var _ broker.Publisher = (*Publisher)(nil)
