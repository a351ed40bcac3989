package pgoutbox_test

import (
	"testing"

	"github.com/idem-dev/idem/outboxtest"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
)

// TestConformance runs the outbox suite on PostgreSQL in each notify mode
// (after-commit: the harness's transactions call Notify after Commit).
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(c *pgoutbox.Config)
	}{
		{"notify-in-tx", nil},
		{"notify-after-commit", func(c *pgoutbox.Config) { c.Notify = pgoutbox.NotifyAfterCommit }},
		{"poll", func(c *pgoutbox.Config) { c.Notify = pgoutbox.NotifyOff }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outboxtest.Run(t, func(t testing.TB) outboxtest.Harness { return harness(t, tc.mod) },
				outboxtest.Features{ConcurrentTx: true, HoldEnds: true})
		})
	}
}
