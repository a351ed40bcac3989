package redisstore_test

import (
	"fmt"

	"github.com/idem-dev/idem/redisstore"
)

// One URL names a single node or a cluster, with go-redis's options and
// the store's.
func ExampleFromURL() {
	c, err := redisstore.FromURL("redis+cluster://10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000&read_timeout=2s&namespace=payments&wait_replicas=1")
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Cluster.Addrs, c.Cluster.ReadTimeout, c.Client == nil)
	fmt.Println(c.Store.Namespace, c.Store.WaitReplicas)
	// Then: s, err := c.Open(ctx) (the Store closes the client it made).

	// Output:
	// [10.0.0.1:7000 10.0.0.2:7000 10.0.0.3:7000] 2s true
	// payments 1
}
