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
// returned; a later Fetch takes its result. Called with s.mu held.
func (s *Subscriber) readAhead(max int) {
	if s.ahead != nil || len(s.buf) > 0 || s.closed.Load() {
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

// fromAhead returns up to max entries read ahead (waiting for a read in
// flight unless ctx ends first: ok false, and the read stays for the next
// Fetch). Entries that waited for half the ack wait since they were read
// (or since their last reset) get their idle time reset first, so no
// reclaim took them meanwhile; what max leaves stays for the next Fetch.
// Called with s.mu held.
func (s *Subscriber) fromAhead(ctx context.Context, max int) (msgs []*broker.Message, ok bool, err error) {
	if len(s.buf) == 0 && s.ahead != nil {
		select {
		case r := <-s.ahead:
			s.ahead = nil
			if r.err != nil {
				return nil, true, r.err
			}
			s.buf, s.bufAt = r.msgs, r.at
		case <-ctx.Done():
			return nil, false, nil
		}
	}
	if len(s.buf) == 0 {
		return nil, true, nil
	}
	if time.Since(s.bufAt) > s.cfg.AckWait/2 {
		ids := make([]string, len(s.buf))
		for i, m := range s.buf {
			ids[i] = m.Acker.(*acker).id
		}
		if err := s.cfg.Client.XClaimJustID(ctx, &redis.XClaimArgs{Stream: s.cfg.Stream, Group: s.cfg.Group, Consumer: s.cfg.Consumer, Messages: ids}).Err(); err != nil {
			return nil, true, err
		}
		s.bufAt = time.Now()
	}
	n := min(max, len(s.buf))
	msgs, s.buf = s.buf[:n:n], s.buf[n:]
	return msgs, true, nil
}
