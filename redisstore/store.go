package redisstore

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/rediserr"
	"github.com/redis/go-redis/v9"
)

// Store is an idem.Store on Redis (single node, Sentinel or Cluster). It
// also implements idem.BatchClaimer, idem.BatchCompleter,
// idem.BatchExtender, idem.Purger, idem.Lister, idem.Stater, idem.Pinger
// and idem.ErrorClassifier. Safe for concurrent use.
type Store struct {
	cfg     Config
	client  redis.UniversalClient
	cluster bool
	base    string // Prefix + Namespace + ":{"
	seq     string // single node: the namespace's token counter
	closed  atomic.Bool
	co      *coalescer // nil with Config.NoCoalesce
}

var (
	_ idem.Store           = (*Store)(nil)
	_ idem.BatchClaimer    = (*Store)(nil)
	_ idem.BatchCompleter  = (*Store)(nil)
	_ idem.BatchExtender   = (*Store)(nil)
	_ idem.Purger          = (*Store)(nil)
	_ idem.Lister          = (*Store)(nil)
	_ idem.Stater          = (*Store)(nil)
	_ idem.Pinger          = (*Store)(nil)
	_ idem.ErrorClassifier = (*Store)(nil)
)

// New validates cfg, applies defaults and returns a Store. Unless
// cfg.SkipChecks is set it asks each master for maxmemory-policy and logs a
// warning when it is not noeviction (an evicted record lets a duplicate
// through). New does not fail when Redis is unreachable: every operation
// fails closed until it is back.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if rt, ok := clientReadTimeout(cfg.Client); ok && cfg.WaitReplicas > 0 && rt <= cfg.WaitTimeout {
		// WAIT blocks up to WaitTimeout on the server; a shorter client read
		// timeout turns every slow replica into an i/o timeout (unknown outcome).
		return nil, fmt.Errorf("%w: redisstore: the client's ReadTimeout %s must be longer than WaitTimeout %s", idem.ErrInvalidArgument, rt, cfg.WaitTimeout)
	}
	s := newStore(cfg)
	if !cfg.SkipChecks {
		s.checkEviction(ctx)
	}
	return s, nil
}

func newStore(cfg Config) *Store {
	_, cluster := cfg.Client.(*redis.ClusterClient)
	s := &Store{cfg: cfg, client: cfg.Client, cluster: cluster, base: cfg.Prefix + cfg.Namespace + ":{", seq: cfg.Prefix + cfg.Namespace + ":seq"}
	if !cfg.NoCoalesce {
		s.co = &coalescer{s: s, max: cfg.CoalesceInFlight}
	}
	return s
}

// Namespace returns a Store for another namespace on the same client and
// settings. Closing it never closes the client.
func (s *Store) Namespace(ns string) (*Store, error) {
	if err := idem.ValidateNamespace(ns); err != nil {
		return nil, err
	}
	cfg := s.cfg
	cfg.Namespace, cfg.CloseClient = ns, false
	return newStore(cfg), nil
}

func (s *Store) checkEviction(ctx context.Context) {
	check := func(ctx context.Context, c *redis.Client) error {
		if info, err := c.Info(ctx, "server").Result(); err == nil && !versionOK(info) {
			s.cfg.Logger.Error("redisstore: Redis 7.0 or later is required (SET with NX and GET together); every claim will fail", "addr", c.Options().Addr)
		}
		v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			s.cfg.Logger.Warn("redisstore: cannot read maxmemory-policy; make sure it is noeviction", "addr", c.Options().Addr, "err", err)
			return nil
		}
		if p := v["maxmemory-policy"]; p != "noeviction" {
			s.cfg.Logger.Warn("redisstore: maxmemory-policy is not noeviction: Redis may evict idempotency records under memory pressure and let duplicates through",
				"addr", c.Options().Addr, "maxmemory-policy", p)
		}
		return nil
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachMaster(ctx, check); err != nil {
			s.cfg.Logger.Warn("redisstore: cannot check cluster masters", "err", err)
		}
	case *redis.Client:
		_ = check(ctx, c)
	}
}

// versionOK reports whether INFO server shows Redis 7.0 or later (true when
// it cannot tell: the scripts' own errors will say).
func versionOK(info string) bool {
	for _, l := range strings.Split(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:")
		if !ok {
			continue
		}
		major, err := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
		return err != nil || major >= 7
	}
	return true
}

// Close marks the store closed (later calls return idem.ErrClosed) and
// closes the client if Config.CloseClient is set.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.cfg.CloseClient {
		return s.client.Close()
	}
	return nil
}

func (s *Store) begin(ctx context.Context) error {
	if s.closed.Load() {
		return idem.ErrClosed
	}
	return ctx.Err()
}

// shard picks the token counter of a key: FNV-1a, so the layout does not
// depend on the client library.
func (s *Store) shard(key []byte) string {
	h := fnv.New32a()
	h.Write(key)
	return strconv.FormatUint(uint64(h.Sum32()%uint32(s.cfg.Shards)), 10)
}

// recordKey is Prefix+Namespace+":{shard}:k:"+key. The token counter of a
// claim script (counterKey) is Prefix+Namespace+":{shard}:seq" on a
// cluster, where the hash tag {shard} puts records and their counter in one
// slot, and Prefix+Namespace+":seq" on a single node, where one counter
// serves every key of the namespace (see scripts.go).
func (s *Store) recordKey(shard string, key []byte) string {
	var b strings.Builder
	b.Grow(len(s.base) + len(shard) + 4 + len(key))
	b.WriteString(s.base)
	b.WriteString(shard)
	b.WriteString("}:k:")
	b.Write(key)
	return b.String()
}

func (s *Store) counterKey(shard string) string {
	if !s.cluster {
		return s.seq
	}
	return s.base + shard + "}:seq"
}

func (s *Store) keysOf(key []byte) (rec, counter string) {
	sh := s.shard(key)
	return s.recordKey(sh, key), s.counterKey(sh)
}

// Claim implements idem.Store with one script run.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idem.Claim{}, err
	}
	if s.co != nil {
		return s.co.claim(ctx, req)
	}
	rk, ck := s.keysOf(req.Key)
	c := &call{script: claimScript, keys: []string{ck, rk}, args: claimArgs(nil, req)}
	if err := s.run(ctx, []*call{c}, "claim"); err != nil {
		return idem.Claim{}, err
	}
	res, err := decodeClaims(c.cmd, []idem.ClaimRequest{req})
	if err != nil {
		return idem.Claim{}, err
	}
	return res[0].Claim, res[0].Err
}

// claimArgs appends one key's ARGV of claimScript: the tail of its new
// record, "ld|xd|ttl|len(fp)|0|<fp>", and px = xd.
func claimArgs(args []any, req idem.ClaimRequest) []any {
	lease, ttl := msUp(req.Lease), msUp(req.TTL)
	px := max(lease, ttl)
	b := make([]byte, 0, 48+len(req.Fingerprint))
	b = strconv.AppendInt(b, lease, 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, px, 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, ttl, 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, int64(len(req.Fingerprint)), 10)
	b = append(b, "|0|"...)
	b = append(b, req.Fingerprint...)
	return append(args, b, px)
}

// msUp is d in whole milliseconds rounded up, plus one. The scripts take
// their time from TIME truncated to the millisecond, up to 1 ms before the
// true time, and add durations in ms to it; with msUp, a lease (or a
// retention) never ends before the true time of the claim plus what was
// asked. It may end up to 2 ms later.
func msUp(d time.Duration) int64 {
	return int64((d+time.Millisecond-1)/time.Millisecond) + 1
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	if err := validateCompletion(key, token, result); err != nil {
		return err
	}
	return s.update(ctx, "c", key, token, result, 0)
}

func validateCompletion(key []byte, token uint64, result []byte) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	return idem.ValidateResult(result)
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.update(ctx, "r", key, token, cause, len(cause))
}

// Fail implements idem.Store.
func (s *Store) Fail(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	return s.update(ctx, "f", key, token, cause, len(cause))
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	if err := idem.ValidateToken(key, token); err != nil {
		return err
	}
	if err := idem.ValidateLease(lease); err != nil {
		return err
	}
	return s.update(ctx, "e", key, token, msUp(lease), 0)
}

// update runs updateScript; alen is the length of a cause (see scripts.go).
func (s *Store) update(ctx context.Context, op string, key []byte, token uint64, arg any, alen int) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	rk, _ := s.keysOf(key)
	c := &call{script: updateScript, keys: []string{rk}, args: []any{op, strconv.FormatUint(token, 10), arg, alen}}
	if err := s.run(ctx, []*call{c}, opName(op)); err != nil {
		return err
	}
	n, err := c.cmd.Int64()
	if err != nil {
		return fmt.Errorf("redisstore: %s: unexpected reply: %w", opName(op), err)
	}
	return updateErr(n, key, token)
}

// updateErr maps a code of the Lua update function (see luaUpdate) onto
// the error the method returns.
func updateErr(n int64, key []byte, token uint64) error {
	switch n {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("%w: key %q", idem.ErrNotFound, trunc(key))
	case -1:
		return fmt.Errorf("%w: key %q token %d", idem.ErrFenced, trunc(key), token)
	case -2:
		return corruptErr(key, "")
	}
	return fmt.Errorf("redisstore: key %q: unexpected update code %d", trunc(key), n)
}

func opName(op string) string {
	switch op {
	case "c":
		return "complete"
	case "r":
		return "release"
	case "f":
		return "fail"
	}
	return "extend"
}

// Get implements idem.Store with one GET (a read; Redis hides expired keys
// itself).
func (s *Store) Get(ctx context.Context, key []byte) (idem.Record, error) {
	if err := idem.ValidateKey(key); err != nil {
		return idem.Record{}, err
	}
	if err := s.begin(ctx); err != nil {
		return idem.Record{}, err
	}
	rk, _ := s.keysOf(key)
	v, err := s.client.Get(ctx, rk).Result()
	if err == redis.Nil {
		return idem.Record{}, fmt.Errorf("%w: key %q", idem.ErrNotFound, trunc(key))
	}
	if err != nil {
		if isWrongType(err) {
			return idem.Record{}, corruptErr(key, err.Error())
		}
		return idem.Record{}, mapErr(ctx, err, "get", false)
	}
	return parseRecord(key, v)
}

// Delete implements idem.Store (admin eviction). The token counter stays,
// so a later claim still gets a larger token.
func (s *Store) Delete(ctx context.Context, key []byte) error {
	if err := idem.ValidateKey(key); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	rk, _ := s.keysOf(key)
	if err := s.client.Del(ctx, rk).Err(); err != nil {
		return mapErr(ctx, err, "delete", true)
	}
	return nil
}

// Ping implements idem.Pinger: PING every master (one for a single node).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	} else {
		err = s.client.Ping(ctx).Err()
	}
	return mapErr(ctx, err, "ping", false)
}

// ClassifyError implements idem.ErrorClassifier for errors of go-redis
// calls the store did not make itself (a handler's effect on the same
// Redis): idem.ErrUnavailable when the command surely did not run (dial
// failure, pool timeout, LOADING, READONLY, CLUSTERDOWN, TRYAGAIN,
// MASTERDOWN, MOVED/ASK, MISCONF, NOREPLICAS, BUSY, auth and max-clients
// replies; OOM also matches idem.ErrCapacity), idem.ErrUnknownOutcome when
// it was sent and its answer lost (connection reset, broken pipe, i/o
// timeout, unexpected EOF); anything else, including a bare io.EOF and
// context errors, unchanged (see idem.ClassifyError).
func (s *Store) ClassifyError(err error) error { return rediserr.Classify(err) }

// Purge implements idem.Purger as a no-op that reports 0: every record
// carries a PEXPIREAT at its ExpiresAt, and Redis removes expired keys by
// itself (lazily on access and by its active expiry cycle), so there is
// nothing for a purger to do.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	return 0, nil
}

// isWrongType reports Redis' WRONGTYPE reply: the key holds a value of
// another type than the command works on.
func isWrongType(err error) bool { return redis.HasErrorPrefix(err, "WRONGTYPE") }

func trunc(k []byte) []byte {
	if len(k) > 64 {
		return k[:64]
	}
	return k
}

func mapErr(ctx context.Context, err error, op string, write bool) error {
	return rediserr.Map(ctx, err, "redisstore: "+op, write)
}

// clientReadTimeout reports the client's effective read timeout (go-redis:
// 0 means 3s, negative means none) where the client type exposes it.
func clientReadTimeout(c redis.UniversalClient) (time.Duration, bool) {
	var rt time.Duration
	switch c := c.(type) {
	case *redis.Client:
		rt = c.Options().ReadTimeout
	case *redis.ClusterClient:
		rt = c.Options().ReadTimeout
	default:
		return 0, false
	}
	switch {
	case rt == 0:
		return 3 * time.Second, true
	case rt < 0:
		return 0, false
	}
	return rt, true
}
