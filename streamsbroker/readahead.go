package streamsbroker

import (
	"context"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/redis/go-redis/v9"
)

type aheadResult struct {
	msgs []*broker.Message
	err  error
	at   time.Time
}

// readAhead sends the next XREADGROUP (without BLOCK) in the background,
// so its round trip overlaps what the caller does with the messages just
// returned; the next Fetch takes its result. Called with s.mu held.
func (s *Subscriber) readAhead(max int) {
	if s.ahead != nil || s.closed.Load() {
		return
	}
	ch := make(chan aheadResult, 1)
	s.ahead = ch
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		msgs, err := s.read(ctx, max, -1)
		ch <- aheadResult{msgs: msgs, err: err, at: time.Now()}
	}()
}

// takeAhead returns the read-ahead result if one was sent (ok), waiting for
// it unless ctx ends first (then it stays for the next Fetch). Entries that
// waited in it for half the ack wait get their idle time reset first, so
// no reclaim takes them meanwhile. Called with s.mu held.
func (s *Subscriber) takeAhead(ctx context.Context) ([]*broker.Message, bool, error) {
	if s.ahead == nil {
		return nil, true, nil
	}
	select {
	case r := <-s.ahead:
		s.ahead = nil
		if len(r.msgs) > 0 && time.Since(r.at) > s.cfg.AckWait/2 {
			ids := make([]string, len(r.msgs))
			for i, m := range r.msgs {
				ids[i] = m.Acker.(*acker).id
			}
			err := s.cfg.Client.XClaimJustID(ctx, &redis.XClaimArgs{Stream: s.cfg.Stream, Group: s.cfg.Group, Consumer: s.cfg.Consumer, Messages: ids}).Err()
			if err != nil {
				return nil, true, err
			}
		}
		return r.msgs, true, r.err
	case <-ctx.Done():
		return nil, false, nil
	}
}
