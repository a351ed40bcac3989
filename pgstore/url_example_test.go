package pgstore_test

import (
	"fmt"

	"github.com/idem-dev/idem/pgstore"
)

// FromURL reads pgx's settings and the store's from one URL, without
// connecting; adjust either before Open (or Migrate).
func ExampleFromURL() {
	c, err := pgstore.FromURL("postgres://app:secret@db.internal:5432/orders?sslmode=disable&pool_max_conns=20&namespace=payments&layout=sharded&shards=32")
	if err != nil {
		panic(err)
	}
	c.Store.PurgeBatch = 500 // anything the URL does not say
	fmt.Println(c.Pool.ConnConfig.Host, c.Pool.ConnConfig.Database, c.Pool.MaxConns)
	fmt.Println(c.Store.Namespace, c.Store.Layout, c.Store.Shards, c.Validate())
	// Then: s, err := c.Open(ctx) (the Store owns the pool), after c.Migrate(ctx) on a new database.

	// Output:
	// db.internal orders 20
	// payments sharded 32 <nil>
}
