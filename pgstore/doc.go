// Package pgstore is a PostgreSQL idem.Store on github.com/jackc/pgx/v5.
//
// Records live in a table keyed by (namespace, 16-byte SHA-256 of the key),
// with the raw key beside the hash, so keys of any bytes and any length up
// to idem.MaxKeyLen are compared exactly and never hit PostgreSQL's index
// entry size limit. Leases and retention use the database clock
// (statement_timestamp()), shared by every worker. Tokens come from one
// sequence per table (value times 1024), drawn under the row lock on
// takeover, so they grow per key across expiry, purge and Delete.
//
// A claim is one statement: INSERT ... ON CONFLICT DO UPDATE ... WHERE
// <takeover allowed> RETURNING, which also reads the conflicting row in the
// same statement when the takeover is not allowed. ClaimBatch first runs a
// bare multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING token (one
// sequence value per statement), so a batch of fresh keys costs one round
// trip; only the keys that already had a row go through the claim
// statement over unnest()ed arrays, in a second one. CompleteBatch and
// ExtendBatch pipeline Complete's (Extend's) own token-checked UPDATE per
// entry, in index order, in one round trip on one connection: the guard's
// heartbeat extends the claims due in a tick this way instead of taking a
// pool connection per claim.
//
// Transactional use: ClaimTx/CompleteTx (and ClaimBatchTx/CompleteBatchTx)
// take the caller's pgx.Tx, and DoTx runs the caller's effect between
// claim and completion in ONE transaction, retrying serialization failures
// and resolving a COMMIT whose answer was lost from the transaction's id
// (pg_xact_status) and the record, without the backend PID, so it works
// behind a pooler.
//
// Store.ClassifyError (idem.ErrorClassifier) maps the driver's errors that
// a DoTx handler or a ClaimTx caller gets onto idem.ErrUnavailable and
// idem.ErrUnknownOutcome. A damaged record (a value out of range) is
// idem.ErrCorrupt for its key alone.
//
// Layouts (Config.Layout): a single table; N hash shards; a time-ordered
// index for keys that carry their own time (UUIDv7, ULID, Snowflake), which
// makes inserts append at the right edge of the index; and declarative time
// partitions on that key time, whose retention drops whole partitions once
// every record in them has expired. Maintenance (Purge,
// DropExpiredPartitions) may run beside claims from any number of Store
// values and processes; a Store value recreates a partition another one
// dropped.
//
// Run Migrate (or cmd/pgstore-migrate) before use. See docs/pgstore.md for
// the design and docs/benchmarks/pgstore.md for measurements.
package pgstore
