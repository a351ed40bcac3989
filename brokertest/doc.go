// Package brokertest is the conformance suite every idem broker adapter
// runs, in the manner of Watermill's pub/sub tests: the adapter supplies a
// Factory that makes an isolated topic with publisher and subscriber
// constructors, and a Features value saying what the broker promises;
// Run checks publish/consume, header, key and payload round-trips, large
// and empty payloads, settle-once semantics, redelivery after Nak and
// after a subscriber dies without settling, that nothing counts as
// consumed before it is acked, that the deliveries a closed subscriber
// left report broker.ErrDeliveryLost, Term, ordering where promised and
// consumer groups.
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, func(t testing.TB) brokertest.Env {
//			topic := uniqueTopic(t) // created here, deleted in t.Cleanup
//			return brokertest.Env{
//				Topic:         topic,
//				NewPublisher:  func(t testing.TB) broker.Publisher { ... },
//				NewSubscriber: func(t testing.TB, group string) broker.Subscriber { ... },
//			}
//		}, brokertest.Features{ConsumerGroups: true, RedeliverAfterClose: true})
//	}
//
// Each subtest checks for goroutine leaks with goleak after closing what it
// opened.
//
// Every wait for something that must NOT happen (an acked, terminated or
// in-progress message coming back) is derived from Features.AckWait, and
// where it can the case leaves a control message unsettled that must come
// back meanwhile, so a wait too short to see the fault fails instead of
// passing. TestSuiteCatchesMutants runs the cases against deliberately
// broken adapters (the in-memory broker with one fault each: Ack, Term or
// InProgress ignored, Nak delay ignored, messages lost, reordered or
// redelivered after an ack, headers dropped...) and requires the cases
// that test each broken promise to fail.
package brokertest
