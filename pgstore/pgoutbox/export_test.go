package pgoutbox

import (
	"context"

	"github.com/idem-dev/idem/outbox"
)

// CrashBatch ends b as a dead relay would: its connection closes without a
// COMMIT, so the server rolls the claim back.
func CrashBatch(b outbox.Batch) {
	pb := b.(*batch)
	if pb.done {
		return
	}
	pb.done = true
	_ = pb.conn.Conn().Close(context.Background())
	pb.conn.Release()
}
