package mysqlstore_test

import (
	"fmt"

	"github.com/idem-dev/idem/mysqlstore"
)

// A MySQL DSN is not a URL: FromURL maps one onto the other.
func ExampleFromURL() {
	c, err := mysqlstore.FromURL("mysql://app:p%40ss@db.internal/orders?tls=preferred&timeout=5s&namespace=payments")
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Driver.FormatDSN())
	fmt.Println(c.Store.Namespace)
	// Output:
	// app:p@ss@tcp(db.internal:3306)/orders?allowFallbackToPlaintext=true&timeout=5s&tls=preferred
	// payments
}
