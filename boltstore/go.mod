module github.com/idem-dev/idem/boltstore

go 1.26

require (
	github.com/idem-dev/idem v0.1.0
	go.etcd.io/bbolt v1.5.0
)

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	golang.org/x/sys v0.45.0 // indirect
)

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/idem-dev/idem/outboxtest v0.1.0
	github.com/idem-dev/idem/storetest v0.1.0
	go.uber.org/goleak v1.3.0
)
