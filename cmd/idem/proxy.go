package main

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/httpidem"
)

// proxyConfig is `idem proxy`'s configuration beyond the global flags.
type proxyConfig struct {
	server          serverFlags
	upstream        string
	upstreamTimeout time.Duration
	requireKey      []string
	lease, ttl      time.Duration
	maxBody         int64
	scopeHeader     string
}

func proxyCmd(g *globals) *cobra.Command {
	var c proxyConfig
	cmd := &cobra.Command{
		Use:   "proxy --upstream URL",
		Short: "put Idempotency-Key semantics in front of any HTTP API",
		Long: `Forward requests to --upstream with the semantics of the IETF
Idempotency-Key header (docs/http.md): for POST, PUT, PATCH and DELETE with a
key, the first request is forwarded once and its response stored in --store;
a repeat gets the stored response with "Idempotent-Replayed: true"; a repeat
while the first is in flight gets 409 with Retry-After; the same key with
another method, path or body gets 422; no key on a --require-key route gets
400; an upstream 5xx, timeout or dropped connection is not stored (the
client may retry with the same key). The proxy itself never re-sends a
request.

Every flag can be set from the environment variable named after it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runProxy(cmd.Context(), g, c) },
	}
	c.server.add(cmd, "IDEM_PROXY", "127.0.0.1:8081", httpidem.DefaultUpstreamTimeout+30*time.Second)
	fs := cmd.Flags()
	fs.StringVar(&c.upstream, "upstream", "", "the API to forward to (http:// or https:// URL; required)")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", httpidem.DefaultUpstreamTimeout, "time the upstream has to answer, body included (then 504, key released)")
	fs.StringSliceVar(&c.requireKey, "require-key", nil, "PATH-PREFIX where POST/PUT/PATCH/DELETE must carry Idempotency-Key (repeatable; a list in the variable: a,b)")
	fs.DurationVar(&c.lease, "lease", httpidem.DefaultLease, "how long a request in flight holds its key if this process dies (a heartbeat extends it meanwhile)")
	fs.DurationVar(&c.ttl, "ttl", httpidem.DefaultTTL, "how long a stored response is replayed")
	fs.Int64Var(&c.maxBody, "max-body", httpidem.DefaultMaxBodyBytes, "largest request body with a key (413 above)")
	fs.StringVar(&c.scopeHeader, "key-scope-header", "", "scope keys per value of this request header (e.g. Authorization: one client never replays another's request)")
	for name, env := range map[string]string{
		"upstream": "IDEM_PROXY_UPSTREAM", "upstream-timeout": "IDEM_PROXY_UPSTREAM_TIMEOUT", "require-key": "IDEM_PROXY_REQUIRE_KEY",
		"lease": "IDEM_PROXY_LEASE", "ttl": "IDEM_PROXY_TTL", "max-body": "IDEM_PROXY_MAX_BODY", "key-scope-header": "IDEM_PROXY_KEY_SCOPE_HEADER",
	} {
		bindEnv(fs, name, env)
	}
	return cmd
}

func (c proxyConfig) validate() (*url.URL, error) {
	if err := c.server.validate(); err != nil {
		return nil, err
	}
	if c.upstream == "" {
		return nil, usageError("--upstream is required")
	}
	u, err := url.Parse(c.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError("--upstream %q: want an http:// or https:// URL with a host", c.upstream)
	}
	if c.upstreamTimeout <= 0 {
		return nil, usageError("--upstream-timeout %s: want a positive duration", c.upstreamTimeout)
	}
	if c.upstreamTimeout >= c.server.writeTimeout {
		return nil, usageError("--upstream-timeout %s must be shorter than --write-timeout %s, or a slow upstream's answer is cut", c.upstreamTimeout, c.server.writeTimeout)
	}
	for _, p := range c.requireKey {
		if !strings.HasPrefix(p, "/") {
			return nil, usageError("--require-key %q: a path prefix starts with /", p)
		}
	}
	if err := idem.ValidateLease(c.lease); err != nil {
		return nil, usageError("--lease: %v", err)
	}
	if err := idem.ValidateTTL(c.ttl); err != nil {
		return nil, usageError("--ttl: %v", err)
	}
	if c.maxBody < 1 {
		return nil, usageError("--max-body %d: want at least 1", c.maxBody)
	}
	return u, nil
}

func runProxy(ctx context.Context, g *globals, c proxyConfig) error {
	upstream, err := c.validate()
	if err != nil {
		return err
	}
	log, _ := c.server.logger(g.stderr)
	octx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	store, b, err := g.open(octx, openOptions{})
	if err != nil {
		return err
	}
	defer b.Close()
	p, err := httpidem.NewProxy(httpidem.ProxyConfig{Upstream: upstream, Timeout: c.upstreamTimeout, Logger: log})
	if err != nil {
		return usageError("%v", err)
	}
	cfg := httpidem.Config{
		Store: store, RequireKey: c.requireKey, Lease: c.lease, TTL: c.ttl, MaxBodyBytes: c.maxBody, Logger: log,
	}
	if h := c.scopeHeader; h != "" {
		// The header's hash, not its value: a credential is not stored.
		cfg.Principal = func(r *http.Request) string {
			sum := sha256.Sum256([]byte(r.Header.Get(h)))
			return string(sum[:])
		}
	}
	mw, err := httpidem.New(cfg)
	if err != nil {
		return usageError("%v", err)
	}
	defer mw.Close()
	log.Info("idem proxy", "upstream", upstream.Redacted(), "store", b.url, "namespace", g.namespace, "require_key", c.requireKey)
	cancel()
	return runServer(ctx, c.server, accessLog(log, mw.Handler(p)), nil, log)
}
