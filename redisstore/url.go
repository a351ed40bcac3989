package redisstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storeurl"
)

// URLConfig is a store configuration read from a URL by FromURL: the
// go-redis client options (exactly one of Client and Cluster is set) and
// the store's settings. Adjust any of them, then call Open.
type URLConfig struct {
	// Client: a single node (redis://, rediss://, unix://), as parsed by
	// redis.ParseURL.
	Client *redis.Options
	// Cluster: Redis Cluster (redis+cluster://, rediss+cluster://), as
	// parsed by redis.ParseClusterURL.
	Cluster *redis.ClusterOptions
	// Store holds the store's settings; Open sets Store.Client.
	Store Config
}

// storeParams are the URL parameters the store takes; every other
// parameter goes to go-redis, which rejects those it does not know.
func storeParams(q *storeurl.Params, c *Config) {
	q.String("namespace", &c.Namespace)
	q.String("prefix", &c.Prefix)
	q.Int("shards", &c.Shards, 1, MaxShards)
	q.Int("wait_replicas", &c.WaitReplicas, 0, 1<<16)
	q.Duration("wait_timeout", &c.WaitTimeout)
	q.Int("batch_chunk", &c.BatchChunk, 1, 4096)
	q.Int("coalesce_in_flight", &c.CoalesceInFlight, 1, 64)
	q.Bool("no_coalesce", &c.NoCoalesce)
	q.Bool("skip_checks", &c.SkipChecks)
}

// FromURL reads a store configuration from a URL, as the idem command's
// --store flag takes it:
//
//	redis://[user:password@]host[:port][/db][?params]      single node
//	rediss://...                                          single node over TLS
//	unix://[user:password@]/path/redis.sock[?db=N&...]     single node on a socket
//	redis+cluster://[user:password@]host:port[?addr=host2:port&addr=...&params]
//	rediss+cluster://...                                  Redis Cluster (over TLS)
//
// The store's own parameters are namespace, prefix, shards, wait_replicas,
// wait_timeout, batch_chunk, coalesce_in_flight, no_coalesce and
// skip_checks (see Config). The rest are go-redis's (redis.ParseURL,
// redis.ParseClusterURL: dial_timeout, read_timeout, pool_size,
// max_retries, protocol, client_name, skip_verify, ...); a parameter
// neither knows is an error.
func FromURL(rawURL string) (*URLConfig, error) {
	u, q, err := storeurl.Parse("redisstore", rawURL, "redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
	if err != nil {
		return nil, err
	}
	c := &URLConfig{}
	storeParams(q, &c.Store)
	if err := q.Err(); err != nil {
		return nil, err
	}
	scheme := strings.ToLower(u.Scheme)
	cluster := strings.HasSuffix(scheme, "+cluster")
	u.Scheme = strings.TrimSuffix(scheme, "+cluster")
	u.RawQuery = q.Rest().Encode()
	bad := func(err error) error {
		return fmt.Errorf("%w: redisstore: URL %s: %v", idem.ErrInvalidArgument, u.Redacted(), err)
	}
	if cluster {
		if c.Cluster, err = redis.ParseClusterURL(u.String()); err != nil {
			return nil, bad(err)
		}
	} else if c.Client, err = redis.ParseURL(u.String()); err != nil {
		return nil, bad(err)
	}
	return c, c.Validate()
}

// Validate reports a configuration error (wrapping idem.ErrInvalidArgument).
func (c *URLConfig) Validate() error {
	if (c.Client == nil) == (c.Cluster == nil) {
		return fmt.Errorf("%w: redisstore: URLConfig needs exactly one of Client and Cluster", idem.ErrInvalidArgument)
	}
	s := c.Store
	if s.Client == nil {
		s.Client = &redis.Client{} // Validate checks the kind of client only
	}
	return s.Validate()
}

// Open makes the client and returns the Store on it (New: no I/O beyond
// the startup checks). Closing the Store closes the client.
func (c *URLConfig) Open(ctx context.Context) (*Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	cfg := c.Store
	if c.Cluster != nil {
		cfg.Client = redis.NewClusterClient(c.Cluster)
	} else {
		cfg.Client = redis.NewClient(c.Client)
	}
	cfg.CloseClient = true
	s, err := New(ctx, cfg)
	if err != nil {
		cfg.Client.Close()
		return nil, err
	}
	return s, nil
}
