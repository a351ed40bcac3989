package e2etest_test

import (
	"fmt"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/e2etest"
)

// Generate yields the originals a batch at a time, each batch with the
// originals to publish again after it.
func ExampleGenerate() {
	originals, dups := 0, 0
	e2etest.Generate("orders", 0, 2500, 1, func(o, d []*broker.Message) {
		originals += len(o)
		dups += len(d)
		fmt.Println(o[0].ID, string(o[0].Payload), len(o))
	})
	fmt.Println(originals, dups)
	// Output:
	// msg-0000000 {"n":0} 1000
	// msg-0001000 {"n":1000} 1000
	// msg-0002000 {"n":2000} 500
	// 2500 2500
}
