package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/script"
	"github.com/redis/go-redis/v9"
)

// call is one script run.
type call struct {
	script *script.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// run executes calls in one round trip (a pipeline of EVALSHA; a
// ClusterClient splits it by node and keeps the order per node). Scripts
// missing from a node's cache (NOSCRIPT: restart, SCRIPT FLUSH; such a
// script did not run) are re-sent with EVAL in a second round trip, in
// order. go-redis never re-sends a script (package internal/redisx/script): a
// lost reply is an error, mapped onto idem.ErrUnknownOutcome. With
// WaitReplicas, a WAIT follows the scripts on the same connection; on a
// cluster that means one pipeline per master, run in parallel.
func (s *Store) run(ctx context.Context, calls []*call, op string) error {
	if len(calls) == 1 && s.cfg.WaitReplicas == 0 {
		c := calls[0]
		c.cmd = c.script.Run(ctx, s.client, c.keys, c.args...)
		if err := c.cmd.Err(); err != nil {
			return mapErr(ctx, err, op, true)
		}
		return nil
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok && s.cfg.WaitReplicas > 0 {
		return s.runPerMaster(ctx, cc, calls, op)
	}
	applied, err := s.pipeline(ctx, s.client, calls, op)
	return partial(applied, len(calls), err)
}

type pipeliner interface{ Pipeline() redis.Pipeliner }

// pipeline runs calls on p in one round trip (two after NOSCRIPT) and says
// how many scripts ran.
func (s *Store) pipeline(ctx context.Context, p pipeliner, calls []*call, op string) (int, error) {
	pending := calls
	applied := 0
	for attempt := 0; len(pending) > 0; attempt++ {
		pipe := p.Pipeline()
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
		var first error
		for _, c := range pending {
			err := c.cmd.Err()
			if err == nil {
				applied++
				continue
			}
			if attempt == 0 && script.NoScript(err) {
				retry = append(retry, c)
				continue
			}
			if first == nil {
				first = err
			}
		}
		if first != nil {
			return applied, mapErr(ctx, first, op, true)
		}
		if wait != nil && len(retry) < len(pending) {
			n, err := wait.Int64()
			if err != nil {
				return applied, fmt.Errorf("%w: redisstore: %s: WAIT: %w", idem.ErrUnknownOutcome, op, err)
			}
			if int(n) < s.cfg.WaitReplicas {
				return applied, fmt.Errorf("%w: redisstore: %s: applied on the master but only %d of %d replicas acknowledged within %s",
					idem.ErrUnknownOutcome, op, n, s.cfg.WaitReplicas, s.cfg.WaitTimeout)
			}
		}
		pending = retry
	}
	return applied, nil
}

// partial turns an error after some scripts ran into ErrUnknownOutcome:
// the call as a whole was partly applied.
func partial(applied, total int, err error) error {
	if err == nil || applied == 0 || errors.Is(err, idem.ErrUnknownOutcome) {
		return err
	}
	return fmt.Errorf("%w: %d of %d scripts applied: %w", idem.ErrUnknownOutcome, applied, total, err)
}

// runPerMaster groups calls by the master that owns their slot and runs one
// pipeline per master, each ending with WAIT on its own connection. A
// redirect (MOVED/ASK: the slot moved since the client last looked) is
// ErrUnavailable for that group, and the client's slot map is reloaded.
func (s *Store) runPerMaster(ctx context.Context, cc *redis.ClusterClient, calls []*call, op string) error {
	type group struct {
		m     *redis.Client
		calls []*call
	}
	var groups []*group
	byMaster := map[*redis.Client]*group{}
	for _, c := range calls {
		m, err := cc.MasterForKey(ctx, c.keys[0])
		if err != nil {
			return mapErr(ctx, err, op, false) // nothing sent yet
		}
		g := byMaster[m]
		if g == nil {
			g = &group{m: m}
			byMaster[m] = g
			groups = append(groups, g)
		}
		g.calls = append(g.calls, c)
	}
	applied := make([]int, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() { applied[i], errs[i] = s.pipeline(ctx, g.m, g.calls, op) })
	}
	wg.Wait()
	total := 0
	for _, n := range applied {
		total += n
	}
	for _, err := range errs {
		if err != nil {
			if redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") {
				cc.ReloadState(ctx)
			}
			return partial(total, len(calls), err)
		}
	}
	return nil
}

// maxChunkBytes bounds the result bytes one completion script carries (a
// chunk always takes at least one entry), so a batch of large results does
// not make one huge command that stalls the server.
const maxChunkBytes = 1 << 20

// batchGroup is one script of a batch: the request indexes it carries, in
// order, and its call.
type batchGroup struct {
	idx   []int
	bytes int
	call  *call
}

// batcher assigns the valid entries of a batch to scripts. Single node: in
// request order, BatchChunk entries per script. Cluster: one script per
// shard (one hash slot), split every BatchChunk entries, so a key's entries
// share a shard and stay in request order (a node runs its pipelined
// scripts in order).
type batcher struct {
	s       *Store
	script  *script.Script
	groups  []*batchGroup
	byShard map[string]*batchGroup
	cur     *batchGroup
}

func (s *Store) newBatcher(sc *script.Script) *batcher {
	return &batcher{s: s, script: sc, byShard: map[string]*batchGroup{}}
}

// add puts entry i of shard sh (carrying size bytes of payload) in a group
// and returns the call to append its keys and args to.
func (b *batcher) add(i int, sh string, size int) *call {
	full := func(g *batchGroup) bool {
		return len(g.idx) >= b.s.cfg.BatchChunk || len(g.idx) > 0 && g.bytes+size > maxChunkBytes
	}
	g := b.cur
	if b.s.cluster {
		g = b.byShard[sh]
	}
	if g == nil || full(g) {
		g = &batchGroup{call: &call{script: b.script}}
		b.groups = append(b.groups, g)
		b.byShard[sh], b.cur = g, g
	}
	g.idx = append(g.idx, i)
	g.bytes += size
	return g.call
}

// run sends every group's script in one round trip (see Store.run).
func (b *batcher) run(ctx context.Context, op string) error {
	calls := make([]*call, len(b.groups))
	for i, g := range b.groups {
		calls[i] = g.call
	}
	return b.s.run(ctx, calls, op)
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
	return s.claimBatch(ctx, reqs)
}

func (s *Store) claimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	out := make([]idem.BatchResult, len(reqs))
	b := s.newBatcher(claimScript)
	for i, r := range reqs {
		if err := idem.ValidateClaim(r); err != nil {
			out[i].Err = err
			continue
		}
		sh := s.shard(r.Key)
		c := b.add(i, sh, 0)
		if len(c.keys) == 0 {
			c.keys = append(c.keys, s.counterKey(sh))
		}
		c.keys = append(c.keys, s.recordKey(sh, r.Key))
		c.args = claimArgs(c.args, r)
	}
	if len(b.groups) == 0 {
		return out, nil
	}
	if err := b.run(ctx, "claim batch"); err != nil {
		return nil, err
	}
	for _, g := range b.groups {
		greqs := make([]idem.ClaimRequest, len(g.idx))
		for j, i := range g.idx {
			greqs[j] = reqs[i]
		}
		res, err := decodeClaims(g.call.cmd, greqs)
		if err != nil {
			return nil, err
		}
		for j, i := range g.idx {
			out[i] = res[j]
		}
	}
	return out, nil
}

// CompleteBatch implements idem.BatchCompleter in one round trip, grouped
// like ClaimBatch (chunks of BatchChunk entries, and at most about
// maxChunkBytes of results per script). Each entry runs the same Lua
// update as Complete, independently: errs[i] is what Complete would return.
// Invalid entries get their error and are never sent. If some scripts ran
// and another failed, the call returns ErrUnknownOutcome (retrying is safe:
// a repeated completion with the same token is a no-op).
func (s *Store) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	return s.updateBatch(ctx, completeBatchScript, "complete batch", len(cs), func(i int) ([]byte, uint64, any, int, error) {
		c := &cs[i]
		return c.Key, c.Token, c.Result, len(c.Result), validateCompletion(c.Key, c.Token, c.Result)
	})
}

// ExtendBatch implements idem.BatchExtender as CompleteBatch does
// completions: one round trip, grouped like ClaimBatch (by shard on a
// cluster), each entry running the same Lua update as Extend. The guard's
// heartbeat sends the claims due in a tick this way instead of one
// round trip per claim.
func (s *Store) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	return s.updateBatch(ctx, extendBatchScript, "extend batch", len(es), func(i int) ([]byte, uint64, any, int, error) {
		x := &es[i]
		err := idem.ValidateToken(x.Key, x.Token)
		if err == nil {
			err = idem.ValidateLease(x.Lease)
		}
		return x.Key, x.Token, msUp(x.Lease), 0, err
	})
}

// updateBatch runs sc (completeBatchScript or extendBatchScript) over n
// entries: entry(i) returns entry i's key, token, argument, payload size
// and validation error. Invalid entries get their error and are never sent.
func (s *Store) updateBatch(ctx context.Context, sc *script.Script, op string, n int, entry func(i int) (key []byte, token uint64, arg any, size int, err error)) ([]error, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	errs := make([]error, n)
	keys := make([][]byte, n)
	toks := make([]uint64, n)
	b := s.newBatcher(sc)
	for i := range n {
		key, tok, arg, size, err := entry(i)
		if err != nil {
			errs[i] = err
			continue
		}
		keys[i], toks[i] = key, tok
		sh := s.shard(key)
		cl := b.add(i, sh, size)
		cl.keys = append(cl.keys, s.recordKey(sh, key))
		cl.args = append(cl.args, strconv.FormatUint(tok, 10), arg)
	}
	if len(b.groups) == 0 {
		return errs, nil
	}
	if err := b.run(ctx, op); err != nil {
		return nil, err
	}
	for _, g := range b.groups {
		codes, err := g.call.cmd.Int64Slice()
		if err != nil || len(codes) != len(g.idx) {
			// The scripts ran: whatever this reply is, they were applied.
			return nil, fmt.Errorf("%w: redisstore: %s: unexpected reply %v: %v", idem.ErrUnknownOutcome, op, g.call.cmd.Val(), err)
		}
		for j, i := range g.idx {
			errs[i] = updateErr(codes[j], keys[i], toks[i])
		}
	}
	return errs, nil
}

// decodeClaims turns claimScript's reply (token, now, then index, code,
// record for each key that did not simply get a new record) into results
// for reqs.
func decodeClaims(cmd *redis.Cmd, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	v, err := cmd.Slice()
	if err != nil || len(v) < 2 || (len(v)-2)%3 != 0 {
		return nil, fmt.Errorf("redisstore: claim: unexpected reply %v: %v", v, err)
	}
	ts, _ := v[0].(string)
	ns, _ := v[1].(string)
	tok, err1 := strconv.ParseUint(ts, 10, 64)
	now, err2 := strconv.ParseInt(ns, 10, 64)
	if err1 != nil || err2 != nil || tok == 0 {
		return nil, fmt.Errorf("redisstore: claim: unexpected reply header %v %v", v[0], v[1])
	}
	out := make([]idem.BatchResult, len(reqs))
	listed := make([]bool, len(reqs))
	for e := v[2:]; len(e) > 0; e = e[3:] {
		i, _ := e[0].(int64)
		code, _ := e[1].(int64)
		raw, ok := e[2].(string)
		if !ok || i < 0 || i >= int64(len(reqs)) || listed[i] || code < 1 || code > 9 || code == 5 || code == 6 {
			return nil, fmt.Errorf("redisstore: claim: unexpected entry %v %v %v", e[0], e[1], e[2])
		}
		listed[i] = true
		// Per-key errors: the script wrote nothing to this key and went on
		// with the others.
		switch code {
		case 9:
			out[i].Err = fmt.Errorf("%w: key %q", idem.ErrFingerprintMismatch, trunc(reqs[i].Key))
			continue
		case 8:
			out[i].Err = corruptErr(reqs[i].Key, raw)
			continue
		case 7:
			out[i].Err = fmt.Errorf("redisstore: claim: key %q: the script rejected its arguments", trunc(reqs[i].Key))
			continue
		}
		rec, err := parseRecord(reqs[i].Key, raw)
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Claim = idem.Claim{Outcome: idem.Outcome(code), Record: rec}
	}
	for i, r := range reqs {
		if !listed[i] {
			out[i].Claim = idem.Claim{Outcome: idem.OutcomeAcquired, Record: freshRecord(r, tok, now)}
		}
	}
	return out, nil
}

// freshRecord is the record claimScript wrote for r with token tok at now
// (unix ms): the one parseRecord would return for it.
func freshRecord(r idem.ClaimRequest, tok uint64, now int64) idem.Record {
	lease, ttl := msUp(r.Lease), msUp(r.TTL)
	var fp []byte
	if len(r.Fingerprint) > 0 {
		fp = append([]byte(nil), r.Fingerprint...)
	}
	t := time.UnixMilli(now)
	return idem.Record{
		Key:         append([]byte(nil), r.Key...),
		State:       idem.StateInProgress,
		Token:       tok,
		Fingerprint: fp,
		Attempts:    1,
		LeaseUntil:  time.UnixMilli(now + lease),
		ExpiresAt:   time.UnixMilli(now + max(lease, ttl)),
		CreatedAt:   t,
		UpdatedAt:   t,
	}
}

// corruptErr is the per-key error (idem.ErrCorrupt) of a value that is not
// a record of this store: bytes it cannot parse, or a value of another type
// (WRONGTYPE). Nothing is written to such a key; Delete removes it. why is
// what is wrong with it (a Redis error, or the part that does not parse).
func corruptErr(key []byte, why string) error {
	if why == "" {
		why = "not a record of this store"
	}
	return fmt.Errorf("%w: redisstore: key %q: %s", idem.ErrCorrupt, trunc(key), why)
}

// parseRecord decodes the record format written by the scripts (see
// scripts.go).
func parseRecord(key []byte, v string) (idem.Record, error) {
	bad := func(what string) (idem.Record, error) {
		return idem.Record{}, corruptErr(key, what)
	}
	var f [13]string
	rest := v
	for i := range f {
		j := strings.IndexByte(rest, '|')
		if j < 0 {
			return bad("header")
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	// Field positions by version: lb, ld, xb, xd, created, updated.
	var pos [6]int
	switch f[0] {
	case "3":
		pos = [6]int{4, 8, 5, 9, 6, 7}
	case "2":
		pos = [6]int{4, 5, 6, 7, 8, 9}
	default:
		return bad("version " + f[0])
	}
	// n[i] is field i: 2 token, 3 attempts, 4-9 times (pos), 10 ttl,
	// 11 len(f), 12 len(e).
	// Digits only, as the scripts' parser (Lua %d+) reads them, and a token
	// of at most 16 digits: a takeover writes the record's token + 1 to the
	// counter, so the scripts refuse a longer one rather than poison it.
	var n [13]int64
	for i := 2; i < len(f); i++ {
		x, err := strconv.ParseUint(f[i], 10, 63)
		if err != nil || i == 2 && len(f[i]) > 16 {
			return bad("field " + strconv.Itoa(i))
		}
		n[i] = int64(x)
	}
	fl, el := n[11], n[12]
	if fl+el > int64(len(rest)) {
		return bad("lengths")
	}
	var st idem.State
	switch f[1] {
	case "p":
		st = idem.StateInProgress
	case "c":
		st = idem.StateCompleted
	case "f":
		st = idem.StateFailed
	case "r":
		st = idem.StateReleased
	default:
		return bad("state " + f[1])
	}
	bs := func(s string) []byte {
		if s == "" {
			return nil
		}
		return []byte(s)
	}
	return idem.Record{
		Key:         append([]byte(nil), key...),
		State:       st,
		Token:       uint64(n[2]),
		Fingerprint: bs(rest[:fl]),
		LastError:   rest[fl : fl+el],
		Result:      bs(rest[fl+el:]),
		Attempts:    int(n[3]),
		LeaseUntil:  time.UnixMilli(n[pos[0]] + n[pos[1]]),
		ExpiresAt:   time.UnixMilli(n[pos[2]] + n[pos[3]]),
		CreatedAt:   time.UnixMilli(n[pos[4]]),
		UpdatedAt:   time.UnixMilli(n[pos[5]]),
	}, nil
}
