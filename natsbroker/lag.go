package natsbroker

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem/broker"
)

// Lag is the durable consumer's count of messages not settled yet:
// NumPending (matching the filter, not yet delivered) plus NumAckPending
// (delivered, not acked or termed), over every subscriber of the durable
// (broker.LagReporter). One request to the server per call.
func (s *Subscriber) Lag(ctx context.Context) (int64, error) {
	select {
	case <-s.ready:
	default:
		return 0, fmt.Errorf("natsbroker: lag of %s/%s: the durable consumer is not created yet", s.cfg.Stream, s.cfg.Durable)
	}
	cons, err := s.consumer(ctx)
	if err != nil {
		return 0, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		if s.closeCtx.Err() != nil {
			return 0, broker.ErrClosed
		}
		return 0, fmt.Errorf("natsbroker: lag of %s/%s: %w", s.cfg.Stream, s.cfg.Durable, err)
	}
	return int64(info.NumPending) + int64(info.NumAckPending), nil
}
