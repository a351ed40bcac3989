// Package redisstore is an idem.Store on Redis (github.com/redis/go-redis/v9),
// for a single node, Sentinel or a Redis Cluster alike (any
// redis.UniversalClient except a Ring). It needs Redis 7.0 or later (SET
// with NX and GET together).
//
// Every write is ONE Lua script that reads the server's clock with TIME, so
// all workers share one clock for leases, and checks the fencing token in
// the same step as it changes the record. A record is one string under
//
//	<Prefix><Namespace>:{<shard>}:k:<key bytes>
//
// (a short numeric header, then fingerprint, last error and result as raw
// bytes), with a TTL ending at its ExpiresAt, so Redis itself drops records
// past retention (Purge is a no-op that reports 0). A new token is
// max(counter+1, server time in µs), which grows across release, expiry and
// delete without keeping anything per key forever; the counter is
// <Prefix><Namespace>:seq on a single node, and one per shard,
// <Prefix><Namespace>:{<shard>}:seq, in its records' hash slot on a cluster. See docs/redisstore.md
// for the key layout, memory per record and the safety settings
// (maxmemory-policy noeviction, WAIT, persistence).
//
// ClaimBatch claims many keys in one round trip: one script per chunk on a
// single node, one script per shard pipelined per node on a cluster.
// CompleteBatch settles many held claims the same way, each entry exactly as
// Complete would (the same Lua update runs per entry); a batch that was only
// partly applied returns idem.ErrUnknownOutcome, and retrying it is safe.
// ExtendBatch extends many leases so too (the guard's heartbeat uses it).
// Concurrent Claim calls share batch scripts too (Config.CoalesceInFlight,
// Config.NoCoalesce).
//
// Errors are mapped onto idem's: a refused connection or a server that
// refuses the command (LOADING, READONLY, CLUSTERDOWN...) is
// idem.ErrUnavailable; a lost reply or timeout after sending a write is
// idem.ErrUnknownOutcome; OOM is idem.ErrUnavailable and idem.ErrCapacity.
// go-redis never re-sends a script (its retries would run a claim twice),
// whatever the client's MaxRetries. A key whose value is not a record of
// this store (bytes it cannot parse, a value of another type) gets
// idem.ErrCorrupt as its own error: in a batch, or a coalesced Claim, the other
// keys proceed, and nothing is written to it. The store never reports
// success it did not get from Redis. Store.ClassifyError
// (idem.ErrorClassifier) maps the go-redis errors of a handler's own Redis
// calls the same way.
//
// Leases and retention are sent rounded up to the millisecond, plus one
// (the scripts' clock is TIME truncated to the millisecond): a lease never
// ends before the claim's time plus what was asked, and may end up to 2 ms
// later.
//
// Package redislock (in this module) is a Redis lock with owner tokens,
// reentrancy, a watchdog and fencing tokens.
package redisstore
