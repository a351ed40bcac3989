package redisstore

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultPrefix      = "idem:"
	DefaultShards      = 1024
	DefaultWaitTimeout = 500 * time.Millisecond
	DefaultBatchChunk  = 128
	// DefaultCoalesceInFlight is how many coalesced claim scripts may be in
	// flight at once (see Config.CoalesceInFlight).
	DefaultCoalesceInFlight = 4
	MaxShards               = 16384
)

// Config configures a Store. Client is required; every other field has a
// default.
type Config struct {
	// Client is a *redis.Client, a *redis.ClusterClient or a failover
	// (Sentinel) client, as made by redis.NewUniversalClient, with any
	// options (TLS, auth, pool, hooks). The store does not close it unless
	// CloseClient is set. Whatever its MaxRetries and MaxRedirects, go-redis
	// never re-sends the store's scripts: a write whose reply was lost
	// returns idem.ErrUnknownOutcome (a re-sent claim would report the
	// caller's own claim in progress, or take it over with one more
	// attempt). Get, Delete, Ping and the SCANs are idempotent single
	// commands and keep the client's retries.
	Client redis.UniversalClient

	// Namespace separates the records of different applications on one
	// Redis; see idem.ValidateNamespace. "" is the default namespace.
	Namespace string

	// Prefix starts every key (default "idem:"). It must not contain '{' or
	// '}' (they would change the hash tag and so the cluster slot).
	Prefix string

	// Shards is the number of token counters per namespace (default 1024,
	// at most 16384). A key's shard is part of its Redis key, so changing it
	// on a live deployment hides every existing record: never change it
	// after the first claim.
	Shards int

	// WaitReplicas, when > 0, sends WAIT WaitReplicas WaitTimeout after each
	// write on the same connection; if fewer replicas acknowledge, the call
	// returns ErrUnknownOutcome (the write is on the master but may be lost
	// by a failover). On a cluster each master's share of a call is
	// pipelined on that master's connection, followed by its WAIT.
	WaitReplicas int
	// WaitTimeout bounds WAIT (default 500ms).
	WaitTimeout time.Duration

	// BatchChunk is the most entries (claims or completions) one batch
	// script runs (default 128), so one huge batch does not stall the server
	// for others; chunks are pipelined in one round trip.
	BatchChunk int

	// Concurrent Claim calls share batch scripts (group-commit style: a
	// caller that finds fewer than CoalesceInFlight scripts in flight sends
	// at once with whatever queued before it; claims arriving meanwhile go
	// in the next script). A lone caller never waits, and under concurrency
	// each claim costs a share of one script and one round trip (see
	// docs/benchmarks/redisstore.md). The cost: a failed round trip fails
	// every claim it carried, each with the same error (ErrUnavailable when
	// nothing was sent, ErrUnknownOutcome when it may have been applied).
	//
	// CoalesceInFlight is the number of scripts in flight at once (default
	// 4, at most 64). NoCoalesce turns coalescing off: every Claim runs its
	// own script on its own pooled connection.
	CoalesceInFlight int
	NoCoalesce       bool

	// Logger gets the startup safety warnings (default slog.Default()).
	Logger *slog.Logger

	// SkipChecks skips the startup checks (maxmemory-policy) New runs.
	SkipChecks bool

	// CloseClient makes Close close Client too.
	CloseClient bool
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.BatchChunk == 0 {
		c.BatchChunk = DefaultBatchChunk
	}
	if c.CoalesceInFlight == 0 {
		c.CoalesceInFlight = DefaultCoalesceInFlight
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports a configuration error (wrapping idem.ErrInvalidArgument).
// It checks the values as given, with zero meaning "default".
func (c Config) Validate() error {
	if c.Client == nil {
		return fmt.Errorf("%w: redisstore: Config.Client is nil", idem.ErrInvalidArgument)
	}
	if _, ok := c.Client.(*redis.Ring); ok {
		return fmt.Errorf("%w: redisstore: *redis.Ring is not supported (it hashes keys client side and cannot run multi-key scripts safely); use a Client or ClusterClient", idem.ErrInvalidArgument)
	}
	if err := idem.ValidateNamespace(c.Namespace); err != nil {
		return err
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("%w: redisstore: Prefix %q must not contain '{' or '}'", idem.ErrInvalidArgument, c.Prefix)
	}
	if len(c.Prefix) > 128 {
		return fmt.Errorf("%w: redisstore: Prefix is %d bytes, the limit is 128", idem.ErrInvalidArgument, len(c.Prefix))
	}
	if c.Shards < 0 || c.Shards > MaxShards {
		return fmt.Errorf("%w: redisstore: Shards %d outside [1, %d]", idem.ErrInvalidArgument, c.Shards, MaxShards)
	}
	if c.WaitReplicas < 0 {
		return fmt.Errorf("%w: redisstore: WaitReplicas %d < 0", idem.ErrInvalidArgument, c.WaitReplicas)
	}
	if c.WaitTimeout < 0 {
		return fmt.Errorf("%w: redisstore: WaitTimeout %s < 0", idem.ErrInvalidArgument, c.WaitTimeout)
	}
	if c.BatchChunk < 0 || c.BatchChunk > 4096 {
		return fmt.Errorf("%w: redisstore: BatchChunk %d outside [1, 4096]", idem.ErrInvalidArgument, c.BatchChunk)
	}
	if c.CoalesceInFlight < 0 || c.CoalesceInFlight > 64 {
		return fmt.Errorf("%w: redisstore: CoalesceInFlight %d outside [1, 64]", idem.ErrInvalidArgument, c.CoalesceInFlight)
	}
	return nil
}
