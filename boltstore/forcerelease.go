package boltstore

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem"
)

var _ idem.ForceReleaser = (*Store)(nil)

// ForceRelease implements idem.ForceReleaser in one write transaction of
// the commit loop (durable when it returns nil).
func (s *Store) ForceRelease(ctx context.Context, key []byte, cause string) error {
	if err := idem.ValidateKey(key); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	key = clone(key)
	return s.b.do(ctx, func(w *wtx, now int64) (error, error) {
		sp, err := w.space(s.name)
		if err != nil {
			return nil, err
		}
		old, err := sp.load(key)
		if err != nil {
			return err, nil // a damaged record: this key's answer, nothing written
		}
		if old == nil || old.expiresAt <= now {
			return fmt.Errorf("%w: key %q", idem.ErrNotFound, key), nil
		}
		// The record's own token: settleTx then only checks the state.
		return settleTx(sp, key, old.token, now, func(r *rec, now int64) (bool, error) {
			if r.state != idem.StateInProgress {
				return false, idem.ErrNotInProgress
			}
			r.state, r.leaseUntil = idem.StateReleased, 0
			if cause != "" {
				r.lastErr = cause
			}
			return true, nil
		})
	})
}
