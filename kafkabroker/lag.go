package kafkabroker

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Lag is the group's count of records not committed yet on the
// subscriber's topics: each partition's end offset minus the group's
// committed offset (its start offset where the group has committed
// nothing), over every member of the group (broker.LagReporter). Records
// acked but not yet committed (CommitInterval) still count. A few
// requests to the cluster per call (describe group, fetch offsets, list
// offsets).
func (s *Subscriber) Lag(ctx context.Context) (int64, error) {
	lags, err := kadm.NewClient(s.cl).Lag(ctx, s.cfg.Group)
	if err != nil {
		return 0, fmt.Errorf("kafkabroker: lag of group %s: %w", s.cfg.Group, err)
	}
	l, ok := lags[s.cfg.Group]
	if !ok {
		return 0, fmt.Errorf("kafkabroker: lag of group %s: not described", s.cfg.Group)
	}
	if err := l.Error(); err != nil {
		return 0, fmt.Errorf("kafkabroker: lag of group %s: %w", s.cfg.Group, err)
	}
	var n int64
	for _, topic := range s.cfg.Topics {
		for _, p := range l.Lag[topic] {
			if p.Err != nil {
				return 0, fmt.Errorf("kafkabroker: lag of group %s on %s/%d: %w", s.cfg.Group, topic, p.Partition, p.Err)
			}
			n += max(p.Lag, 0)
		}
	}
	return n, nil
}
