package memstore

import (
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storeurl"
)

// FromURL reads a Config from a memory:// URL, as the idem command's
// --store flag takes it:
//
//	memory://[?namespace=NS&max_entries=N&shards=N&sweep_interval=DURATION]
//
// The URL has no host or path. Adjust the returned Config if needed, then
// call New (which validates it). Records live as long as the process.
func FromURL(rawURL string) (Config, error) {
	u, q, err := storeurl.Parse("memstore", rawURL, "memory")
	if err != nil {
		return Config{}, err
	}
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.Opaque != "" || u.User != nil {
		return Config{}, fmt.Errorf("%w: memstore: a memory URL has no host, user or path (got %q): use memory:// or memory://?namespace=NS", idem.ErrInvalidArgument, u.Redacted())
	}
	var c Config
	q.String("namespace", &c.Namespace)
	q.Int("max_entries", &c.MaxEntries, 1, 1<<40)
	q.Int("shards", &c.Shards, 1, 1<<16)
	q.Duration("sweep_interval", &c.SweepInterval)
	if err := q.Done(); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}
