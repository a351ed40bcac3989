// Package memoutbox is the in-memory outbox.Backend: the reference
// implementation of the contract, for tests and for producers whose
// "business transaction" is in memory too. Nothing survives the process.
//
// Transactions (Begin, Enqueue, Commit, Rollback) model a database's: a
// row's Seq is taken at Enqueue, and the row becomes visible to claims only
// at Commit, so transactions may commit out of Seq order, as they do in
// PostgreSQL and MariaDB.
package memoutbox
