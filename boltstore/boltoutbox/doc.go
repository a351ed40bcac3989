// Package boltoutbox is the transactional outbox in an embedded bbolt file,
// for a single node: the business data and the outbox live in the same
// file, Enqueue writes messages inside the caller's read-write *bbolt.Tx,
// and a relay in the same process claims from Outbox (an outbox.Backend and
// outbox.Notifier: a commit that enqueued wakes it through tx.OnCommit).
//
//	db, _ := bbolt.Open("/var/lib/app/app.db", 0o600, nil)
//	ob, _ := boltoutbox.New(boltoutbox.Config{DB: db, NewID: gen.NextString})
//	err := db.Update(func(tx *bbolt.Tx) error {
//		// ... the business change in tx ...
//		_, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Payload: body})
//		return err
//	})
//	relay, _ := outbox.New(outbox.Config{Backend: ob, Publisher: pub})
//	go relay.Run(ctx)
//
// Layout: a top-level bucket (Config.Bucket) with rows by seq (the bucket's
// sequence, so commit order is seq order here: bbolt has one writer) and
// index buckets kept in the same transactions: due (next attempt, seq),
// pending (seq), keys (key, seq) for ordered claims, sent (updated, seq)
// for retention, failed (seq), ids (id -> seq) for duplicates, and
// counters. Claims are held in memory by the process: bbolt lets one
// process open the file, so a relay that dies takes its claims with it and
// the next process to open the file finds the rows pending, unchanged.
// Every write is a bbolt transaction, durable when it returns (bbolt
// fsyncs each commit).
//
// It lives in the boltstore module so that users of the embedded store
// pull in no other module. It uses its own bbolt file handle (boltstore's
// Store keeps its file to itself).
package boltoutbox
