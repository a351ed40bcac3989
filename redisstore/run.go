package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

// call is one script run.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// run executes calls in one round trip (a pipeline of EVALSHA; a
// ClusterClient splits it by node and keeps the order per node). Scripts
// missing from a node's cache (NOSCRIPT: restart, SCRIPT FLUSH) are re-sent
// with EVAL in a second round trip, in order. With WaitReplicas, a WAIT
// follows the scripts on the same connection.
func (s *Store) run(ctx context.Context, calls []*call, op string) error {
	if len(calls) == 1 && s.cfg.WaitReplicas == 0 {
		c := calls[0]
		c.cmd = c.script.Run(ctx, s.client, c.keys, c.args...)
		if err := c.cmd.Err(); err != nil {
			return mapErr(ctx, err, op, true)
		}
		return nil
	}
	pending := calls
	for attempt := 0; len(pending) > 0; attempt++ {
		pipe := s.client.Pipeline()
		for _, c := range pending {
			if attempt == 0 {
				c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
			} else {
				c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
			}
		}
		var wait *redis.Cmd
		if s.cfg.WaitReplicas > 0 {
			wait = pipe.Do(ctx, "WAIT", s.cfg.WaitReplicas, s.cfg.WaitTimeout.Milliseconds())
		}
		_, _ = pipe.Exec(ctx)
		var retry []*call
		for _, c := range pending {
			err := c.cmd.Err()
			if err == nil {
				continue
			}
			if attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				retry = append(retry, c)
				continue
			}
			return mapErr(ctx, err, op, true)
		}
		if wait != nil && len(retry) < len(pending) {
			n, err := wait.Int64()
			if err != nil {
				return fmt.Errorf("%w: redisstore: %s: WAIT: %w", idem.ErrUnknownOutcome, op, err)
			}
			if int(n) < s.cfg.WaitReplicas {
				return fmt.Errorf("%w: redisstore: %s: applied on the master but only %d of %d replicas acknowledged within %s",
					idem.ErrUnknownOutcome, op, n, s.cfg.WaitReplicas, s.cfg.WaitTimeout)
			}
		}
		pending = retry
	}
	return nil
}

// ClaimBatch implements idem.BatchClaimer in one round trip. On a single
// node, one script claims up to BatchChunk keys in request order (chunks
// pipelined on one connection). On a cluster, keys are grouped by shard
// (one hash slot each) and each group runs as one script, pipelined per
// node; a key's entries always share a group, so a key that appears twice
// is acquired by its first entry and reported in progress for the second.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	out := make([]idem.BatchResult, len(reqs))
	type group struct {
		idx  []int
		reqs []idem.ClaimRequest
		call *call
	}
	var groups []*group
	byShard := map[string]*group{}
	var cur *group
	for i, r := range reqs {
		if err := idem.ValidateClaim(r); err != nil {
			out[i].Err = err
			continue
		}
		sh := s.shard(r.Key)
		var g *group
		if s.cluster {
			g = byShard[sh]
			if g != nil && len(g.idx) >= s.cfg.BatchChunk {
				g = nil
			}
		} else if cur != nil && len(cur.idx) < s.cfg.BatchChunk {
			g = cur
		}
		if g == nil {
			g = &group{call: &call{script: claimScript}}
			groups = append(groups, g)
			byShard[sh], cur = g, g
		}
		g.idx = append(g.idx, i)
		g.reqs = append(g.reqs, r)
		g.call.keys = append(g.call.keys, s.recordKey(sh, r.Key), s.seqKey(sh))
		g.call.args = claimArgs(g.call.args, r)
	}
	if len(groups) == 0 {
		return out, nil
	}
	calls := make([]*call, len(groups))
	for i, g := range groups {
		calls[i] = g.call
	}
	if err := s.run(ctx, calls, "claim batch"); err != nil {
		return nil, err
	}
	for _, g := range groups {
		res, err := decodeClaims(g.call.cmd, g.reqs)
		if err != nil {
			return nil, err
		}
		for j, i := range g.idx {
			out[i] = res[j]
		}
	}
	return out, nil
}

// decodeClaims turns claimScript's reply into results for reqs.
func decodeClaims(cmd *redis.Cmd, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	v, err := cmd.Slice()
	if err != nil || len(v) != len(reqs) {
		return nil, fmt.Errorf("redisstore: claim: unexpected reply %v: %v", v, err)
	}
	out := make([]idem.BatchResult, len(reqs))
	for i, e := range v {
		ent, ok := e.([]any)
		if !ok || len(ent) == 0 {
			return nil, fmt.Errorf("redisstore: claim: unexpected entry %v", e)
		}
		code, _ := ent[0].(int64)
		if code == 9 {
			out[i].Err = fmt.Errorf("%w: key %q", idem.ErrFingerprintMismatch, trunc(reqs[i].Key))
			continue
		}
		if len(ent) != 11 || code < 1 || code > 4 {
			return nil, fmt.Errorf("redisstore: claim: unexpected entry %v", e)
		}
		rec, err := decodeRecord(reqs[i].Key, ent[1:])
		if err != nil {
			return nil, err
		}
		out[i].Claim = idem.Claim{Outcome: idem.Outcome(code), Record: rec}
	}
	return out, nil
}

// decodeRecord reads values in recordFields order.
func decodeRecord(key []byte, v []any) (idem.Record, error) {
	str := func(i int) string { s, _ := v[i].(string); return s }
	var b []byte
	bytesOf := func(i int) []byte {
		if s, ok := v[i].(string); ok && s != "" {
			return append(b, s...)
		}
		return nil
	}
	num := func(i int) (int64, error) {
		s := str(i)
		if s == "" {
			return 0, nil
		}
		return strconv.ParseInt(s, 10, 64)
	}
	ms := func(i int) time.Time {
		n, _ := num(i)
		if n == 0 {
			return time.Time{}
		}
		return time.UnixMilli(n)
	}
	var st idem.State
	switch str(0) {
	case "p":
		st = idem.StateInProgress
	case "c":
		st = idem.StateCompleted
	case "f":
		st = idem.StateFailed
	case "r":
		st = idem.StateReleased
	default:
		return idem.Record{}, fmt.Errorf("redisstore: key %q: bad state %q", trunc(key), str(0))
	}
	tok, err := strconv.ParseUint(str(1), 10, 64)
	if err != nil {
		return idem.Record{}, fmt.Errorf("redisstore: key %q: bad token %q", trunc(key), str(1))
	}
	att, err := num(4)
	if err != nil {
		return idem.Record{}, fmt.Errorf("redisstore: key %q: bad attempts %q", trunc(key), str(4))
	}
	return idem.Record{
		Key:         append([]byte(nil), key...),
		State:       st,
		Token:       tok,
		Fingerprint: bytesOf(2),
		Result:      bytesOf(3),
		Attempts:    int(att),
		LastError:   str(5),
		LeaseUntil:  ms(6),
		ExpiresAt:   ms(7),
		CreatedAt:   ms(8),
		UpdatedAt:   ms(9),
	}, nil
}
