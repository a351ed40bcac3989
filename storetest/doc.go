// Package storetest is the conformance suite every idem.Store runs against
// its real backend:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t testing.TB, ns string) idem.Store {
//			s := mystore.New(... shared backend ..., ns)
//			t.Cleanup(func() { s.Close() })
//			return s
//		}, storetest.Features{Batch: true, Purge: true, List: true, Stats: true})
//	}
//
// It checks the contract written on idem.Store and the optional interfaces:
// atomic claims under contention, exact replay of stored bytes, lease
// expiry and takeover with larger tokens, fencing of stale tokens on every
// method, retention, release and re-claim, fingerprints, key edge cases
// (NUL, invalid UTF-8, case, trailing spaces, the length limit), namespace
// isolation, context cancellation, batch semantics, and a linearizability
// check of random concurrent histories with porcupine.
//
// It is its own module so that the core keeps no third-party dependency;
// its own tests run it against the memory store.
package storetest
