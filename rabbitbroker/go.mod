module github.com/idem-dev/idem/rabbitbroker

go 1.26.0

require (
	github.com/idem-dev/idem v0.0.0
	github.com/idem-dev/idem/brokertest v0.0.0
	go.uber.org/goleak v1.3.0
)

require github.com/rabbitmq/amqp091-go v1.16.0

replace github.com/idem-dev/idem => ../

replace github.com/idem-dev/idem/brokertest => ../brokertest

replace github.com/idem-dev/idem/pgstore => ../pgstore

replace github.com/idem-dev/idem/storetest => ../storetest

replace github.com/idem-dev/idem/e2etest => ../e2etest
