// Package streamsbroker is idem's Redis Streams adapter (go-redis v9) for
// the broker-neutral model in package broker. See docs/streamsbroker.md.
package streamsbroker
