// Package brokertest is the conformance suite every idem broker adapter
// runs, in the manner of Watermill's pub/sub tests: the adapter supplies a
// Factory that makes an isolated topic with publisher and subscriber
// constructors, and a Features value saying what the broker promises;
// Run checks publish/consume, header, key and payload round-trips, large
// and empty payloads, settle-once semantics, redelivery after Nak and
// after a subscriber dies without settling, that nothing counts as
// consumed before it is acked, Term, ordering where promised and consumer
// groups.
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
package brokertest
