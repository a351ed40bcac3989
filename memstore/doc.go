// Package memstore is idem's in-memory store: sharded, bounded, with
// background TTL eviction that locks one shard at a time. It is the
// reference implementation of the idem.Store contract and passes the shared
// conformance suite (github.com/idem-dev/idem/storetest).
//
// It forgets everything when the process exits: a crash or a power loss
// loses every record, acknowledged or not, and with them the tokens issued
// (a new process starts its counters again). Use it where the effects are in
// the same process's memory and die with it, in tests, or as a cache tier;
// use the embedded file store (boltstore) or a server store for anything
// durable.
//
// Maintenance runs concurrently with claims: the background sweeper and
// Purge take one shard lock at a time and, under it, remove only records
// whose ExpiresAt has passed at that moment, so a record claimed again or
// extended meanwhile stays. A full shard drops its expired records before
// refusing a new key with idem.ErrCapacity; it never evicts a live one.
// Its records are Go values, so none can be undecodable (storetest's
// BadRecordPerKey does not apply), and ClassifyError has nothing of its own
// to classify.
package memstore
