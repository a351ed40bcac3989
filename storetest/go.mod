module github.com/idem-dev/idem/storetest

go 1.26

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/idem-dev/idem v0.1.0
	go.uber.org/goleak v1.3.0
)
