package redisstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

// scanCount is the COUNT hint of each SCAN step.
const scanCount = 512

// nodes lists the clients to SCAN: every master of a cluster, sorted by
// address so that a cursor means the same thing from call to call, or the
// client itself.
func (s *Store) nodes(ctx context.Context) ([]redis.Cmdable, []string, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []redis.Cmdable{s.client}, []string{""}, nil
	}
	var mu sync.Mutex
	m := map[string]redis.Cmdable{}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		m[c.Options().Addr] = c
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, nil, mapErr(ctx, err, "list", false)
	}
	addrs := make([]string, 0, len(m))
	for a := range m {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	cs := make([]redis.Cmdable, len(addrs))
	for i, a := range addrs {
		cs[i] = m[a]
	}
	return cs, addrs, nil
}

// matchPattern is the SCAN MATCH pattern of this namespace's records.
func (s *Store) matchPattern() string {
	var b strings.Builder
	for _, r := range s.base {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteString("*}:k:*")
	return b.String()
}

// userKey extracts the idempotency key from a record key.
func (s *Store) userKey(rk string) ([]byte, bool) {
	if !strings.HasPrefix(rk, s.base) {
		return nil, false
	}
	i := strings.Index(rk[len(s.base):], "}:k:")
	if i < 0 {
		return nil, false
	}
	return []byte(rk[len(s.base)+i+4:]), true
}

// listCursor is node index, SCAN cursor and the last record key returned
// from that SCAN step (hex), so a page can stop in the middle of a step.
type listCursor struct {
	node int
	scan uint64
	last string
}

func (c listCursor) String() string {
	return strconv.Itoa(c.node) + "-" + strconv.FormatUint(c.scan, 10) + "-" + hex.EncodeToString([]byte(c.last))
}

func parseCursor(s string) (listCursor, error) {
	var c listCursor
	if s == "" {
		return c, nil
	}
	parts := strings.Split(s, "-")
	if len(parts) != 3 {
		return c, fmt.Errorf("%w: redisstore: bad cursor %q", idem.ErrInvalidArgument, s)
	}
	n, err1 := strconv.Atoi(parts[0])
	sc, err2 := strconv.ParseUint(parts[1], 10, 64)
	last, err3 := hex.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil || n < 0 {
		return c, fmt.Errorf("%w: redisstore: bad cursor %q", idem.ErrInvalidArgument, s)
	}
	return listCursor{node: n, scan: sc, last: string(last)}, nil
}

// ListInProgress implements idem.Lister with SCAN (MATCH on the namespace's
// record keys) on each master in turn and one pipelined GET per step. It
// is O(records in the database) over a full iteration and, like SCAN, may
// miss or repeat records that appear, vanish or move (resharding) while it
// runs. limit <= 0 means 100.
func (s *Store) ListInProgress(ctx context.Context, cursor string, limit int) ([]idem.Record, string, error) {
	if err := s.begin(ctx); err != nil {
		return nil, "", err
	}
	cur, err := parseCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if limit <= 0 {
		limit = 100
	}
	nodes, _, err := s.nodes(ctx)
	if err != nil {
		return nil, "", err
	}
	var out []idem.Record
	for cur.node < len(nodes) {
		keys, next, err := nodes[cur.node].Scan(ctx, cur.scan, s.matchPattern(), scanCount).Result()
		if err != nil {
			return nil, "", mapErr(ctx, err, "list", false)
		}
		slices.Sort(keys)
		if cur.last != "" {
			i, _ := slices.BinarySearch(keys, cur.last)
			for i < len(keys) && keys[i] <= cur.last {
				i++
			}
			keys = keys[i:]
		}
		recs, rks, err := s.fetch(ctx, nodes[cur.node], keys)
		if err != nil {
			return nil, "", err
		}
		for i, r := range recs {
			if r.State != idem.StateInProgress {
				continue
			}
			out = append(out, r)
			if len(out) == limit {
				c := listCursor{node: cur.node, scan: cur.scan, last: rks[i]}
				return out, c.String(), nil
			}
		}
		cur.last = ""
		if next == 0 {
			cur.node++
			cur.scan = 0
		} else {
			cur.scan = next
		}
		if len(out) > 0 && cur.node < len(nodes) {
			return out, cur.String(), nil
		}
	}
	return out, "", nil
}

// fetch reads the records at keys (skipping vanished ones) in one pipeline
// and returns them with their Redis keys.
func (s *Store) fetch(ctx context.Context, c redis.Cmdable, keys []string) ([]idem.Record, []string, error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	var recs []idem.Record
	var rks []string
	for i, cmd := range cmds {
		uk, ok := s.userKey(keys[i])
		if !ok {
			continue
		}
		v, err := cmd.Result()
		if err == redis.Nil {
			continue // expired since the SCAN
		}
		if err != nil && !isWrongType(err) {
			return nil, nil, mapErr(ctx, err, "list", false)
		}
		var r idem.Record
		if err == nil {
			r, err = parseRecord(uk, v)
		}
		if err != nil {
			// Not a record of ours (idem.ErrCorrupt): not in progress either.
			// Claims of that key fail with idem.ErrCorrupt until it is deleted.
			s.cfg.Logger.Warn("redisstore: list: skipping a value that is not a record", "key", string(trunc(uk)), "err", err)
			continue
		}
		recs = append(recs, r)
		rks = append(rks, keys[i])
	}
	return recs, rks, nil
}

// Stats implements idem.Stater by scanning every record of the namespace:
// O(records in the database), one SCAN step and one pipelined GETRANGE per 512
// keys. Meant for dashboards on modest data sets, not for hot paths.
func (s *Store) Stats(ctx context.Context) (idem.Stats, error) {
	var st idem.Stats
	if err := s.begin(ctx); err != nil {
		return st, err
	}
	nodes, _, err := s.nodes(ctx)
	if err != nil {
		return st, err
	}
	for _, n := range nodes {
		var cur uint64
		for {
			keys, next, err := n.Scan(ctx, cur, s.matchPattern(), scanCount).Result()
			if err != nil {
				return st, mapErr(ctx, err, "stats", false)
			}
			if len(keys) > 0 {
				pipe := n.Pipeline()
				cmds := make([]*redis.StringCmd, len(keys))
				for i, k := range keys {
					cmds[i] = pipe.GetRange(ctx, k, 0, 2) // "<version>|<state>"
				}
				_, _ = pipe.Exec(ctx) // errors are read per command below
				for _, c := range cmds {
					if err := c.Err(); err != nil && err != redis.Nil && !isWrongType(err) {
						return st, mapErr(ctx, err, "stats", false)
					}
					v := c.Val() // not a record of ours (another type, bad bytes): not counted
					if len(v) != 3 || v[1] != '|' || v[0] != '2' && v[0] != '3' {
						continue
					}
					switch v[2] {
					case 'p':
						st.InProgress++
					case 'c':
						st.Completed++
					case 'f':
						st.Failed++
					case 'r':
						st.Released++
					}
				}
			}
			if next == 0 {
				break
			}
			cur = next
		}
	}
	return st, nil
}
