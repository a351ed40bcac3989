module github.com/idem-dev/idem/outboxtest

go 1.26

require (
	github.com/idem-dev/idem v0.1.0
	go.uber.org/goleak v1.3.0
)
