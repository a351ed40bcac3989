// Package watermillidem is a Watermill (github.com/ThreeDotsLabs/watermill)
// handler middleware backed by an idem guard, a drop-in replacement for
// Watermill's middleware.Deduplicator:
//
//	d, err := watermillidem.New(watermillidem.Config{Guard: guard})
//	router.AddMiddleware(d.Middleware)
//
// Watermill's deduplicator keeps the keys it has seen in memory (one
// process, one minute by default), keys on a hash of the payload (two
// different messages with one payload are one; an Adler-32 collision drops
// a message) and marks a key seen before the handler runs, so a message
// whose handler failed is dropped as a duplicate when Watermill redelivers
// it. This middleware keys on the message UUID (or a metadata field),
// claims it in idem's store (memory, bolt, Redis, PostgreSQL, MySQL) with a
// lease and a fencing token, runs the handler only under the claim,
// releases the key when the handler fails, never acks a duplicate of a
// message still in progress, checks a payload fingerprint, replays the
// messages the first run produced, and dead-letters a message that failed
// for good exactly once. See docs/watermill.md.
package watermillidem
