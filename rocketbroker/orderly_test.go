//go:build !race

// The client's orderly consumption reads a queue's message tree without
// its lock (processQueue.takeMessages calls msgCache.Empty() while the
// pull goroutine puts messages under the lock), which the race detector
// reports in whatever test is running: these tests run without -race
// (go test ./rocketbroker/..., or the README's long-run command).

package rocketbroker_test

import "testing"

// TestOrderlyConformance runs the suite with Orderly: each queue is
// consumed one message at a time, in order, under a broker lock; a nak
// suspends the queue and delivers the same message again. Without
// RedeliverAfterClose: its cases fetch ten messages without settling any,
// and an orderly queue hands out its next message only once the current
// one is settled (redelivery after a consumer's death is the same as
// concurrently: TestConformance). On the fake, queue locks expire after
// 3s instead of 60s, so a queue moved by a rebalance is taken over
// quickly (the client does not unlock a queue it drops).
func TestOrderlyConformance(t *testing.T) {
	testConformance(t, true)
}
