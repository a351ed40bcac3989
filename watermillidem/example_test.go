package watermillidem_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/watermillidem"
)

// The middleware in place of Watermill's deduplicator: the router and the
// handler stay as they are. Any idem store works; a shared one (Redis,
// PostgreSQL...) dedups across processes.
func Example() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store, idem.WithMaxAttempts(5))
	defer guard.Close()
	dedup, _ := watermillidem.New(watermillidem.Config{Guard: guard})

	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer pubSub.Close()
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddMiddleware(dedup.Middleware) // was: (&middleware.Deduplicator{}).Middleware
	router.AddConsumerHandler("charge", "orders", pubSub, func(m *message.Message) error {
		token, _ := watermillidem.TokenFromContext(m.Context()) // fencing token of the claim
		fmt.Println("charged", m.UUID, token > 0)
		return nil
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = router.Run(context.Background())
	}()
	<-router.Running()

	order := message.NewMessage("order-42", []byte(`{"amount":10}`))
	_ = pubSub.Publish("orders", order)
	_ = pubSub.Publish("orders", message.NewMessage(order.UUID, order.Payload)) // a producer's retry
	_ = router.Close()
	<-done
	fmt.Printf("%+v\n", dedup.Stats())
	// Output:
	// charged order-42 true
	// {Handled:1 Duplicates:1 InProgress:0 StoreErrors:0 DeadLettered:0 Holds:0 Unrecorded:0 LeaseLost:0}
}
