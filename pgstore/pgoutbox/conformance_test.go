package pgoutbox_test

import (
	"testing"

	"github.com/idem-dev/idem/outboxtest"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
)

// TestConformance runs the outbox suite on PostgreSQL, with NOTIFY on (the
// default) and off (relays poll).
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(c *pgoutbox.Config)
	}{
		{"notify", nil},
		{"poll", func(c *pgoutbox.Config) { c.NoNotify = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outboxtest.Run(t, func(t testing.TB) outboxtest.Harness { return harness(t, tc.mod) },
				outboxtest.Features{ConcurrentTx: true})
		})
	}
}
