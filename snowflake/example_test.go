package snowflake_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/snowflake"
)

// A generator leasing its worker id from a store (any idem.Store: Redis,
// PostgreSQL, MariaDB, the embedded file), and an id split back into its
// parts.
func Example() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	gen, err := snowflake.New(context.Background(), snowflake.Config{Store: store})
	if err != nil {
		panic(err)
	}
	defer gen.Close()

	a, _ := gen.Next()
	b, _ := gen.Next()
	p, _ := snowflake.DefaultLayout.Parse(b)
	fmt.Println("increasing:", b > a)
	fmt.Println("same worker:", p.Worker == gen.Worker())
	fmt.Println("made just now:", time.Since(p.Time) < time.Minute)

	// The time a key carries, as the SQL stores' time-ordered layouts read it.
	kt, _ := snowflake.DefaultLayout.KeyTime()([]byte(b.String()))
	fmt.Println("keytime agrees:", kt.Equal(p.Time))
	// Output:
	// increasing: true
	// same worker: true
	// made just now: true
	// keytime agrees: true
}

func ExampleLayout_Parse() {
	id, _ := snowflake.DefaultLayout.Compose(snowflake.Parts{
		Time:     time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC),
		Worker:   5,
		Sequence: 42,
	})
	p, _ := snowflake.DefaultLayout.Parse(id)
	fmt.Println(id, p.Time.Format(time.RFC3339), p.Worker, p.Sequence)
	// Output: 915572942438420522 2026-12-01T12:00:00Z 5 42
}
