// Package memstore is idem's in-memory store: sharded, bounded, with
// background TTL eviction that locks one shard at a time. It is the
// reference implementation of the idem.Store contract and passes the shared
// conformance suite (github.com/idem-dev/idem/storetest).
//
// It forgets everything when the process exits. Use it where the effects
// are in the same process's memory, in tests, or as a cache tier; use the
// embedded file store (boltstore) or a server store for anything durable.
package memstore
