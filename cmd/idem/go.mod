module github.com/idem-dev/idem/cmd/idem

go 1.26

require (
	github.com/idem-dev/idem v0.0.0
	github.com/idem-dev/idem/boltstore v0.0.0
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.10
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	golang.org/x/sys v0.45.0 // indirect
)

replace (
	github.com/idem-dev/idem => ../../
	github.com/idem-dev/idem/boltstore => ../../boltstore
	github.com/idem-dev/idem/storetest => ../../storetest
)
