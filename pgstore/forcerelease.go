package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5"
)

var _ idem.ForceReleaser = (*Store)(nil)

// forceReleaseSQL releases the live in-progress record of a key whatever
// its token (the release mutation without the token check).
func (s *Store) forceReleaseSQL(t *tableSQL) string {
	cond, n := "r.ns = $1 AND r.key_hash = $2", 2
	if s.cfg.Layout.timed() {
		cond, n = cond+" AND r.key_time = $3", 3
	}
	key, cause := fmt.Sprintf("$%d::bytea", n+1), fmt.Sprintf("$%d::text", n+2)
	return `UPDATE ` + t.name + ` r SET state = 4, last_error = CASE WHEN ` + cause + ` = '' THEN r.last_error ELSE ` + cause + ` END, updated_at = statement_timestamp()
WHERE ` + cond + ` AND r.key = ` + key + ` AND r.state = 1 AND r.expires_at > statement_timestamp() RETURNING r.token`
}

// ForceRelease implements idem.ForceReleaser: one UPDATE of the record in
// progress. When it matches no row, a read tells absent (ErrNotFound) from
// settled (ErrNotInProgress); a record found in progress again by then (a
// claim in between) is tried again.
func (s *Store) ForceRelease(ctx context.Context, key []byte, cause string) error {
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	r, err := s.ref(key)
	if err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	sql := s.forceReleaseSQL(&s.tables[r.table])
	for attempt := 0; attempt < maxSettle; attempt++ {
		var token int64
		err := s.pool.QueryRow(ctx, sql, s.args(r, r.key, cause)...).Scan(&token)
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			if s.retryable(ctx, err) {
				continue
			}
			return s.mapErr(ctx, err, true)
		}
		rec, err := s.Get(ctx, key)
		if err != nil {
			return err
		}
		if rec.State != idem.StateInProgress {
			return fmt.Errorf("%w: key %q is %s", idem.ErrNotInProgress, key, rec.State)
		}
	}
	return fmt.Errorf("%w: pgstore: force release of key %q kept racing with claims", idem.ErrUnavailable, key)
}
