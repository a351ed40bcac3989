package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/idem-dev/idem"
)

var _ idem.ForceReleaser = (*Store)(nil)

// ForceRelease implements idem.ForceReleaser: one UPDATE of the record in
// progress, whatever its token. When it changes no row, a read tells absent
// (ErrNotFound) from settled (ErrNotInProgress); a record found in progress
// again by then (a claim in between) is tried again.
func (s *Store) ForceRelease(ctx context.Context, key []byte, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	l, err := s.locate(key)
	if err != nil {
		return err
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	var sb strings.Builder
	sb.WriteString("UPDATE ")
	sb.WriteString(l.table)
	sb.WriteString(forcePK + " SET ")
	releaseOp(cause).set(&sb)
	sb.WriteString(", updated_at = " + nowUS + " WHERE ")
	s.pk(&sb, l)
	sb.WriteString(" AND k = ")
	hexLit(&sb, key)
	sb.WriteString(" AND state = 1 AND expires_at > " + nowUS)
	update := sb.String()
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	for attempt := 0; attempt < 4; attempt++ {
		var res sql.Result
		err := s.retry(ctx, true, func() error {
			var err error
			res, err = c.ExecContext(ctx, update)
			return err
		})
		if err != nil {
			return mapErr(err, true)
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			return nil
		}
		r, err := s.get(ctx, c, key, l, "")
		if err != nil {
			return err
		}
		if r.State != idem.StateInProgress {
			return fmt.Errorf("%w: key %q is %s", idem.ErrNotInProgress, truncKey(key), r.State)
		}
	}
	return fmt.Errorf("%w: mysqlstore: force release of key %q: the record kept changing between the statements", idem.ErrUnavailable, truncKey(key))
}
