package mysqloutbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idem-dev/idem/outbox"
)

// CrashBatch ends b as a dead relay would: the server kills its connection
// (KILL CONNECTION from another session), so it rolls the claim back.
func CrashBatch(db *sql.DB) func(b outbox.Batch) {
	return func(b outbox.Batch) {
		mb := b.(*batch)
		if mb.done {
			return
		}
		mb.done = true
		var id int64
		if err := mb.tx.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
			panic(err)
		}
		if _, err := db.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			panic(err)
		}
		_ = mb.tx.Rollback() // fails on the dead connection; frees it in database/sql
		mb.cancel()
	}
}
