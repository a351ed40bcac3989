package memstore

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem"
)

var _ idem.ForceReleaser = (*Store)(nil)

// ForceRelease implements idem.ForceReleaser.
func (s *Store) ForceRelease(ctx context.Context, key []byte, cause string) error {
	if err := idem.ValidateKey(key); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	now, err := s.begin(ctx)
	if err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.live(key, now)
	switch {
	case e == nil:
		return fmt.Errorf("%w: key %q", idem.ErrNotFound, key)
	case e.state != idem.StateInProgress:
		return fmt.Errorf("%w: key %q is %s", idem.ErrNotInProgress, key, e.state)
	}
	e.state, e.leaseUntil, e.updated = idem.StateReleased, 0, now
	if cause != "" {
		e.lastErr = cause
	}
	return nil
}
