package pgstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// Purge implements idem.Purger: it deletes this namespace's expired records
// in statements of at most Config.PurgeBatch rows (copying them to the
// history table first when Config.Archive is set), each its own short
// transaction that skips rows a claim has locked.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	total := 0
	for ti := range s.tables {
		t := &s.tables[ti]
		sql := t.purge
		if s.cfg.Archive {
			sql = t.purgeA
		}
		for {
			n := s.cfg.PurgeBatch
			if limit > 0 && limit-total < n {
				n = limit - total
			}
			if n <= 0 {
				return total, nil
			}
			var got int
			if err := s.pool.QueryRow(ctx, sql, s.ns, n).Scan(&got); err != nil {
				return total, s.mapErr(ctx, err, true)
			}
			total += got
			if got < n {
				break
			}
			if err := ctx.Err(); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// ListInProgress implements idem.Lister, in index order. The cursor is
// "<table>.<key time in µs>.<hex key hash>" of the last record returned.
// It reads the primary key index, not a dedicated one, so on a large
// table a page costs a scan over the records between in-progress ones:
// an operator's tool, not a hot path.
func (s *Store) ListInProgress(ctx context.Context, cursor string, limit int) ([]idem.Record, string, error) {
	if err := s.begin(ctx); err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		limit = 100
	}
	ti, after, afterT, err := parseCursor(cursor, len(s.tables))
	if err != nil {
		return nil, "", err
	}
	var out []idem.Record
	var last row
	var lastT *time.Time
	lastTable := ti
	for ; ti < len(s.tables) && len(out) < limit; ti++ {
		args := []any{s.ns, after}
		if s.cfg.Layout.timed() {
			args = append(args, afterT)
		}
		args = append(args, limit-len(out))
		rows, err := s.pool.Query(ctx, s.tables[ti].list, args...)
		if err != nil {
			return nil, "", s.mapErr(ctx, err, false)
		}
		for rows.Next() {
			r, err := scanRow(rowsWithTime{rows, &lastT}, true)
			if err != nil {
				rows.Close()
				return nil, "", s.mapErr(ctx, err, false)
			}
			out = append(out, r.record())
			last, lastTable = r, ti
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, "", s.mapErr(ctx, err, false)
		}
		after, afterT = []byte{}, time.Unix(-62135596800, 0).UTC() // start of the next table
	}
	if len(out) < limit {
		return out, "", nil
	}
	c := fmt.Sprintf("%d.0.%x", lastTable, last.hash)
	if lastT != nil {
		c = fmt.Sprintf("%d.%d.%x", lastTable, lastT.UnixMicro(), last.hash)
	}
	return out, c, nil
}

// rowsWithTime scans the list query's trailing key_time column.
type rowsWithTime struct {
	rows interface{ Scan(...any) error }
	t    **time.Time
}

func (r rowsWithTime) Scan(dst ...any) error { return r.rows.Scan(append(dst, r.t)...) }

func parseCursor(c string, tables int) (int, []byte, time.Time, error) {
	minT := time.Unix(-62135596800, 0).UTC()
	if c == "" {
		return 0, []byte{}, minT, nil
	}
	bad := fmt.Errorf("%w: pgstore: bad cursor %q", idem.ErrInvalidArgument, c)
	parts := strings.Split(c, ".")
	if len(parts) != 3 {
		return 0, nil, minT, bad
	}
	ti, err1 := strconv.Atoi(parts[0])
	us, err2 := strconv.ParseInt(parts[1], 10, 64)
	h, err3 := hex.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil || ti < 0 || ti >= tables {
		return 0, nil, minT, bad
	}
	t := minT
	if us != 0 {
		t = time.UnixMicro(us).UTC()
	}
	return ti, h, t, nil
}

// Stats implements idem.Stater. It counts live rows, which scans this
// namespace's part of the table(s).
func (s *Store) Stats(ctx context.Context) (idem.Stats, error) {
	if err := s.begin(ctx); err != nil {
		return idem.Stats{}, err
	}
	var st idem.Stats
	for ti := range s.tables {
		rows, err := s.pool.Query(ctx, s.tables[ti].stats, s.ns)
		if err != nil {
			return idem.Stats{}, s.mapErr(ctx, err, false)
		}
		for rows.Next() {
			var state int16
			var n int64
			if err := rows.Scan(&state, &n); err != nil {
				rows.Close()
				return idem.Stats{}, s.mapErr(ctx, err, false)
			}
			switch state {
			case stInProgress:
				st.InProgress += n
			case stCompleted:
				st.Completed += n
			case stFailed:
				st.Failed += n
			case stReleased:
				st.Released += n
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return idem.Stats{}, s.mapErr(ctx, err, false)
		}
	}
	return st, nil
}
