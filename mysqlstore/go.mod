module github.com/idem-dev/idem/mysqlstore

go 1.26

require github.com/idem-dev/idem v0.1.0

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/anishathalye/porcupine v1.3.1 // indirect
)

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idem-dev/idem/outboxtest v0.1.0
	github.com/idem-dev/idem/storetest v0.1.0
	go.uber.org/goleak v1.3.0
)
