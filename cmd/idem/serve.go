package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/httpapi/dashboard"
)

func init() { subcommands = append(subcommands, serveCmd, proxyCmd) }

// serveConfig is `idem serve`'s configuration beyond the global flags.
type serveConfig struct {
	server       serverFlags
	tokens       []string // NAMESPACE:TOKEN
	tokenFile    string
	lease, ttl   time.Duration
	maxBody      int64
	maxBatch     int
	storeTimeout time.Duration
	migrate      bool
	dashboard    bool
}

func serveCmd(g *globals) *cobra.Command {
	var c serveConfig
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "serve the HTTP API (claim, complete, release, fail, extend, records, batch claims) on the store",
		Long: `Serve idem's HTTP API (docs/http.md) on --store, so programs in any language
claim keys, record results and read records. Instances on one shared store
(Redis, PostgreSQL, MariaDB) answer as one. With --auth-token, each bearer
token is bound to a namespace and sees only that namespace's keys; without
it, every request works in --namespace.

Stops on SIGTERM or SIGINT: /readyz turns 503, the listener closes after
--drain-delay, requests in flight finish within --shutdown-timeout.

Every flag can be set from the environment variable named after it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd.Context(), g, c) },
	}
	c.server.add(cmd, "IDEM_SERVE", "127.0.0.1:8080", 30*time.Second)
	fs := cmd.Flags()
	fs.StringSliceVar(&c.tokens, "auth-token", nil, "NAMESPACE:TOKEN: require this bearer token, bound to NAMESPACE (repeatable; a list in the variable: a,b)")
	fs.StringVar(&c.tokenFile, "auth-token-file", "", "file of NAMESPACE:TOKEN lines (# comments), added to --auth-token")
	fs.DurationVar(&c.lease, "lease", idem.DefaultLease, "lease of a claim that gives no lease_ms")
	fs.DurationVar(&c.ttl, "ttl", idem.DefaultTTL, "retention of a claim that gives no ttl_ms")
	fs.Int64Var(&c.maxBody, "max-body", httpapi.DefaultMaxBodyBytes, "largest request body in bytes (413 above)")
	fs.IntVar(&c.maxBatch, "max-batch", httpapi.DefaultMaxBatch, "most claims in one /v1/claim/batch")
	fs.DurationVar(&c.storeTimeout, "store-timeout", httpapi.DefaultStoreTimeout, "time a store call may take before the request gets 503 store_timeout")
	fs.BoolVar(&c.migrate, "migrate", false, "create or upgrade the SQL schema before serving (as idem migrate)")
	fs.BoolVar(&c.dashboard, "dashboard", true, "serve the web dashboard at / (live throughput, duplicate rate, latency, keys in progress, recent failures, key search)")
	for name, env := range map[string]string{
		"auth-token": "IDEM_SERVE_AUTH_TOKENS", "auth-token-file": "IDEM_SERVE_AUTH_TOKEN_FILE", "lease": "IDEM_SERVE_LEASE",
		"ttl": "IDEM_SERVE_TTL", "max-body": "IDEM_SERVE_MAX_BODY", "max-batch": "IDEM_SERVE_MAX_BATCH",
		"store-timeout": "IDEM_SERVE_STORE_TIMEOUT", "migrate": "IDEM_SERVE_MIGRATE", "dashboard": "IDEM_SERVE_DASHBOARD",
	} {
		bindEnv(fs, name, env)
	}
	return cmd
}

// parseTokens reads NAMESPACE:TOKEN entries (flag values and file lines).
func parseTokens(entries []string, file string) (map[string]string, error) {
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, usageError("--auth-token-file: %v", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if !strings.Contains(line, ":") {
				return nil, usageError("--auth-token-file %s line %d: want NAMESPACE:TOKEN", file, n)
			}
			entries = append(entries, line)
		}
		if err := sc.Err(); err != nil {
			return nil, usageError("--auth-token-file: %v", err)
		}
	}
	tokens := map[string]string{} // token -> namespace
	for _, e := range entries {
		ns, tok, ok := strings.Cut(e, ":")
		if !ok {
			// Never echo the value: it may be a token given without its namespace.
			return nil, usageError("--auth-token: want NAMESPACE:TOKEN (\":TOKEN\" for the default namespace)")
		}
		if err := idem.ValidateNamespace(ns); err != nil {
			return nil, usageError("--auth-token: namespace: %v", err)
		}
		if len(tok) < httpapi.MinTokenLen {
			return nil, usageError("--auth-token for namespace %q: a token of %d bytes; at least %d are required", ns, len(tok), httpapi.MinTokenLen)
		}
		if _, dup := tokens[tok]; dup {
			return nil, usageError("--auth-token for namespace %q: the same token is given twice", ns)
		}
		tokens[tok] = ns
	}
	return tokens, nil
}

func (c serveConfig) validate() error {
	if err := c.server.validate(); err != nil {
		return err
	}
	if err := idem.ValidateLease(c.lease); err != nil {
		return usageError("--lease: %v", err)
	}
	if err := idem.ValidateTTL(c.ttl); err != nil {
		return usageError("--ttl: %v", err)
	}
	switch {
	case c.maxBody < 1024:
		return usageError("--max-body %d: at least 1024", c.maxBody)
	case c.maxBatch < 1 || c.maxBatch > 100_000:
		return usageError("--max-batch %d outside [1, 100000]", c.maxBatch)
	case c.storeTimeout <= 0:
		return usageError("--store-timeout %s: want a positive duration", c.storeTimeout)
	case c.storeTimeout >= c.server.writeTimeout:
		return usageError("--store-timeout %s must be shorter than --write-timeout %s, or a slow store's answer is cut", c.storeTimeout, c.server.writeTimeout)
	}
	return nil
}

func runServe(ctx context.Context, g *globals, c serveConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	tokens, err := parseTokens(c.tokens, c.tokenFile)
	if err != nil {
		return err
	}
	log, _ := c.server.logger(g.stderr)
	octx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	b, err := openBackend(octx, g.store, openOptions{})
	if err != nil {
		return err
	}
	defer b.Close()
	if c.migrate && b.Migrate != nil {
		if err := b.Migrate(octx); err != nil {
			return fmt.Errorf("--migrate: %w", err)
		}
	}
	handle := func(ns string) (idem.Store, error) {
		s, err := b.Handle(octx, ns)
		if errors.Is(err, idem.ErrInvalidArgument) {
			return nil, usageError("namespace %q: %v", ns, err)
		}
		return s, err
	}
	cfg := httpapi.Config{
		Lease: c.lease, TTL: c.ttl, MaxBodyBytes: c.maxBody, MaxBatch: c.maxBatch,
		StoreTimeout: c.storeTimeout, Logger: log,
	}
	if c.dashboard {
		cfg.Dashboard = dashboard.Handler()
	}
	var first idem.Store
	if len(tokens) == 0 {
		if cfg.Store, err = handle(g.namespace); err != nil {
			return err
		}
		first = cfg.Store
	}
	for tok, ns := range tokens {
		s, err := handle(ns)
		if err != nil {
			return err
		}
		cfg.Tokens = append(cfg.Tokens, httpapi.Token{Namespace: ns, Secret: tok, Store: s})
		first = s
	}
	var served []idem.Store // one handle per namespace (tokens may share one)
	if cfg.Store != nil {
		served = append(served, cfg.Store)
	}
	seen := map[string]bool{}
	for _, tk := range cfg.Tokens {
		if !seen[tk.Namespace] {
			seen[tk.Namespace] = true
			served = append(served, tk.Store)
		}
	}
	var h *httpapi.Handler
	if cfg.Metrics, err = serveMetrics(func(w io.Writer) error { return h.WriteMetrics(w) }, served); err != nil {
		return err
	}
	h, err = httpapi.New(cfg)
	if err != nil {
		return usageError("%v", err)
	}
	if p, ok := first.(idem.Pinger); ok {
		if err := p.Ping(octx); err != nil {
			log.Warn("store not reachable yet; serving anyway (/readyz says 503 until it is)", "store", b.url, "err", err)
		}
	}
	log.Info("idem serve", "store", b.url, "namespaces", namespaces(g.namespace, tokens), "auth", len(tokens) > 0)
	cancel() // the open timeout ends here; requests have their own
	return runServer(ctx, c.server, h, h.Drain, log)
}

func namespaces(def string, tokens map[string]string) []string {
	if len(tokens) == 0 {
		return []string{def}
	}
	seen := map[string]bool{}
	var out []string
	for _, ns := range tokens {
		if !seen[ns] {
			seen[ns] = true
			out = append(out, ns)
		}
	}
	return out
}
