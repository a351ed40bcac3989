module github.com/idem-dev/idem/redisstore

go 1.26.0

require github.com/idem-dev/idem v0.1.0

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

require (
	github.com/idem-dev/idem/storetest v0.1.0
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require github.com/idem-dev/idem/internal/redisx v0.1.0
