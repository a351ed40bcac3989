// Package pgoutbox is the transactional outbox on PostgreSQL: Enqueue
// writes messages inside the caller's pgx.Tx, in the same transaction as
// the business change, and Outbox is the outbox.Backend a relay claims from
// (FOR UPDATE SKIP LOCKED: any number of relays at once), with
// LISTEN/NOTIFY wake-ups (outbox.Notifier): NOTIFY inside the enqueuing
// transaction by default, or after its commit (NotifyAfterCommit, cheaper
// under concurrency), or none (relays poll).
//
//	ob, _ := pgoutbox.New(pgoutbox.Config{Pool: pool, NewID: gen.NextString})
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// ... the business change on tx ...
//		_, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, Payload: body})
//		return err
//	})
//	relay, _ := outbox.New(outbox.Config{Backend: ob, Publisher: pub})
//	go relay.Run(ctx)
//
// The table (Migrate) holds one row per message: seq (an identity: the
// order of a key's messages, never a cursor), id (unique), topic, key,
// headers, payload, status (0 pending, 1 sent, 2 failed: seed 000's
// message_send_log), attempts, next_attempt_at, created_at, updated_at,
// last_error; partial indexes on the due backlog, on pending rows by key
// (ordered claims), on sent rows by time (retention) and on failed rows.
//
// A claim is a transaction on its own pool connection that locks the rows
// it returns; Settle updates them and commits, Release rolls back, and a
// relay that dies loses its connection, so the server rolls back and the
// rows are claimable again at once. Size the pool for one connection per
// claim loop plus one per Listen. See docs/outbox.md.
//
// It lives in the pgstore module so that users of the PostgreSQL store
// pull in no other module.
package pgoutbox
