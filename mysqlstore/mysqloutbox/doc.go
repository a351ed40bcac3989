// Package mysqloutbox is the transactional outbox on MariaDB (10.6+, for
// SKIP LOCKED) and MySQL 8: Enqueue writes messages inside the caller's
// *sql.Tx, in the same transaction as the business change, and Outbox is the
// outbox.Backend a relay claims from.
//
//	ob, _ := mysqloutbox.New(mysqloutbox.Config{DB: db, NewID: gen.NextString})
//	tx, _ := db.BeginTx(ctx, nil)
//	// ... the business change on tx ...
//	if _, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, Payload: body}); err != nil {
//		tx.Rollback()
//	}
//	tx.Commit()
//	relay, _ := outbox.New(outbox.Config{Backend: ob, Publisher: pub}) // polls every 100ms
//
// The table is seed 000's message_send_log grown up: seq (AUTO_INCREMENT:
// the order of a key's messages, never a cursor), id (unique), topic, k,
// headers, payload, status (0 pending, 1 sent, 2 failed), attempts,
// next_attempt_at, created_at, updated_at (microseconds, database clock),
// last_error; indexes (status, next_attempt_at, seq) for claims, (status,
// k, seq) for ordered claims and (status, updated_at) for retention.
//
// A claim is a READ COMMITTED transaction (no gap locks) that selects its
// rows FOR UPDATE SKIP LOCKED, so relays never wait for each other; Settle
// updates them and commits; a relay that dies loses its connection and the
// server rolls the claim back. Statements are text with values inlined as
// hex or integer literals: one round trip each with any DSN. MariaDB has no
// LISTEN/NOTIFY: relays poll (outbox.Config.PollInterval). See
// docs/outbox.md.
//
// It lives in the mysqlstore module so that users of the MariaDB store pull
// in no other module.
package mysqloutbox
