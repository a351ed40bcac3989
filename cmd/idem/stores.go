package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
	"github.com/idem-dev/idem/memstore"
)

// backend is a store opened from a URL (--store). Handles on any namespace
// share its connections; Close closes them all.
type backend struct {
	// url is the store URL with any password replaced by "xxxxx".
	url string
	// Handle returns the store of namespace ns (idem.ValidateNamespace).
	// The handles are closed by Close, not one by one.
	Handle func(ctx context.Context, ns string) (idem.Store, error)
	// Migrate creates or upgrades the store's schema; nil when the store
	// has none.
	Migrate func(ctx context.Context) error
	// Maintain runs the store's own maintenance besides Purge (partition
	// drops and creation of the SQL stores) and says what it did; nil when
	// the store has none.
	Maintain func(ctx context.Context, s idem.Store) ([]string, error)
	Close    func() error
}

// openOptions says what the command needs of the store.
type openOptions struct {
	// existing: the store must exist already (an operations command must
	// not create an empty bolt file where the operator made a typo).
	existing bool
}

// opener opens a backend from a URL of its scheme.
type opener func(ctx context.Context, rawURL string, o openOptions) (*backend, error)

// openers maps URL schemes onto stores.
var openers = map[string]opener{
	"memory": openMemory,
	"bolt":   openBolt,
}

// openBackend opens the store named by rawURL. A URL that does not parse or
// that its store rejects is a usage error (exit 2).
func openBackend(ctx context.Context, rawURL string, o openOptions) (*backend, error) {
	scheme, _, ok := strings.Cut(rawURL, ":")
	if !ok || scheme == "" {
		return nil, usageError("--store %q is not a URL: want one of %s", rawURL, schemeList())
	}
	open := openers[strings.ToLower(scheme)]
	if open == nil {
		return nil, usageError("--store: unknown scheme %q: want one of %s", scheme, schemeList())
	}
	b, err := open(ctx, rawURL, o)
	if err != nil {
		if errors.Is(err, idem.ErrInvalidArgument) {
			return nil, &exitErr{code: exitUsage, err: fmt.Errorf("--store: %w", err)}
		}
		return nil, err
	}
	return b, nil
}

func schemeList() string {
	return "bolt:, memory://, redis://, rediss://, redis+cluster://, postgres://, mysql://"
}

func redact(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil {
		return u.Redacted()
	}
	return "(unparsable URL)"
}

// namespacer is a store whose root handle gives handles on other
// namespaces sharing its connections (memstore, boltstore, redisstore).
type namespacer[S idem.Store] interface {
	Namespace(ns string) (S, error)
	Close() error
}

func rootBackend[S idem.Store](rawURL string, root namespacer[S]) *backend {
	return &backend{
		url:    redact(rawURL),
		Handle: func(_ context.Context, ns string) (idem.Store, error) { return root.Namespace(ns) },
		Close:  root.Close,
	}
}

func openMemory(_ context.Context, rawURL string, _ openOptions) (*backend, error) {
	cfg, err := memstore.FromURL(rawURL)
	if err != nil {
		return nil, err
	}
	root, err := memstore.New(cfg)
	if err != nil {
		return nil, err
	}
	return rootBackend(rawURL, root), nil
}

func openBolt(_ context.Context, rawURL string, o openOptions) (*backend, error) {
	cfg, err := boltstore.FromURL(rawURL)
	if err != nil {
		return nil, err
	}
	if o.existing {
		if _, err := os.Stat(cfg.Path); err != nil {
			return nil, fmt.Errorf("%w: boltstore: %v (give --store or $IDEM_STORE)", idem.ErrUnavailable, err)
		}
	}
	root, err := boltstore.Open(cfg)
	if err != nil {
		return nil, err
	}
	return rootBackend(rawURL, root), nil
}

// open opens the --store backend and the --namespace handle with the
// --timeout applied to ctx. The caller defers the returned close.
func (g *globals) open(ctx context.Context, o openOptions) (idem.Store, *backend, error) {
	b, err := openBackend(ctx, g.store, o)
	if err != nil {
		return nil, nil, err
	}
	s, err := b.Handle(ctx, g.namespace)
	if err != nil {
		b.Close()
		if errors.Is(err, idem.ErrInvalidArgument) {
			return nil, nil, &exitErr{code: exitUsage, err: fmt.Errorf("--namespace: %w", err)}
		}
		return nil, nil, err
	}
	return s, b, nil
}
