package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
	"github.com/idem-dev/idem/pgstore"
	"github.com/idem-dev/idem/redisstore"
)

func init() {
	for _, s := range []string{"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"} {
		openers[s] = openRedis
	}
	openers["postgres"] = openPostgres
	openers["postgresql"] = openPostgres
	openers["mysql"] = openMySQL
}

func openRedis(ctx context.Context, rawURL string, _ openOptions) (*backend, error) {
	c, err := redisstore.FromURL(rawURL)
	if err != nil {
		return nil, err
	}
	root, err := c.Open(ctx)
	if err != nil {
		return nil, err
	}
	return rootBackend(rawURL, root), nil
}

// handles keeps one Store per namespace on a shared pool (the SQL stores
// have no Namespace method: a Store is cheap, its pool is not).
type handles[S idem.Store] struct {
	mu   sync.Mutex
	m    map[string]S
	open func(ctx context.Context, ns string) (S, error)
}

func (h *handles[S]) get(ctx context.Context, ns string) (idem.Store, error) {
	if err := idem.ValidateNamespace(ns); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.m[ns]; ok {
		return s, nil
	}
	s, err := h.open(ctx, ns)
	if err != nil {
		return nil, err
	}
	if h.m == nil {
		h.m = map[string]S{}
	}
	h.m[ns] = s
	return s, nil
}

func (h *handles[S]) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.m {
		s.Close()
	}
	h.m = nil
}

func openPostgres(ctx context.Context, rawURL string, _ openOptions) (*backend, error) {
	c, err := pgstore.FromURL(rawURL)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, c.Pool)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
	}
	h := &handles[*pgstore.Store]{open: func(_ context.Context, ns string) (*pgstore.Store, error) {
		cfg := c.Store
		cfg.Pool, cfg.Namespace = pool, ns
		return pgstore.New(cfg)
	}}
	b := &backend{
		url:    redact(rawURL),
		Handle: h.get,
		Migrate: func(ctx context.Context) error {
			cfg := c.Store
			cfg.Pool = pool
			err := pgstore.Migrate(ctx, cfg)
			var cl pgstore.Store
			return cl.ClassifyError(err)
		},
		Close: func() error { h.close(); pool.Close(); return nil },
	}
	if c.Store.Layout == pgstore.LayoutTimePartitioned {
		b.Maintain = func(ctx context.Context, s idem.Store) ([]string, error) {
			ps := s.(*pgstore.Store)
			n, err := ps.EnsurePartitions(ctx)
			if err != nil {
				return nil, err
			}
			dropped, err := ps.DropExpiredPartitions(ctx)
			return partitionReport(n, dropped, c.Store.Archive), err
		}
	}
	return b, nil
}

func partitionReport(created int, dropped []string, archive bool) []string {
	out := []string{fmt.Sprintf("created %d partition(s)", created)}
	verb := "dropped"
	if archive {
		verb = "archived and dropped"
	}
	for _, d := range dropped {
		out = append(out, verb+" partition "+d)
	}
	return out
}

func openMySQL(ctx context.Context, rawURL string, _ openOptions) (*backend, error) {
	c, err := mysqlstore.FromURL(rawURL)
	if err != nil {
		return nil, err
	}
	// One pool for every namespace: URLConfig.Open would make one each.
	db, err := c.Pool()
	if err != nil {
		return nil, err
	}
	h := &handles[*mysqlstore.Store]{open: func(ctx context.Context, ns string) (*mysqlstore.Store, error) {
		cfg := c.Store
		cfg.DB, cfg.Namespace = db, ns
		s, err := mysqlstore.Open(ctx, cfg)
		if err != nil {
			var cl mysqlstore.Store
			return nil, cl.ClassifyError(err)
		}
		return s, nil
	}}
	b := &backend{
		url:    redact(rawURL),
		Handle: h.get,
		Migrate: func(ctx context.Context) error {
			cfg := c.Store
			cfg.DB = db
			var cl mysqlstore.Store
			return cl.ClassifyError(mysqlstore.Migrate(ctx, cfg))
		},
		Close: func() error { h.close(); return db.Close() },
	}
	if c.Store.Layout == mysqlstore.LayoutTimePartitioned {
		b.Maintain = func(ctx context.Context, s idem.Store) ([]string, error) {
			ms := s.(*mysqlstore.Store)
			n, err := ms.EnsurePartitions(ctx)
			if err != nil {
				return nil, err
			}
			dropped, err := ms.DropExpiredPartitions(ctx)
			return partitionReport(n, dropped, c.Store.Archive), err
		}
	}
	return b, nil
}
