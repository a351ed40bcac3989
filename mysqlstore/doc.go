// Package mysqlstore is an idem.Store on MariaDB (10.5+) or MySQL-compatible
// servers through database/sql and github.com/go-sql-driver/mysql.
//
// Every claim is decided by one atomic statement per key, run in
// autocommit. A new key is created by INSERT IGNORE ... RETURNING (one round
// trip for a batch of new keys, the common case); a key that already has a
// row goes to INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING, whose IF()
// expressions decide the takeover on the row's current state, lease and
// fingerprint under the row lock, and return the resulting row in the same
// statement. Config.SingleStatement sends every claim through the second
// statement only. Tokens come from a SEQUENCE (<table>_token), so they grow
// per key across expiry, purge and delete.
//
// Complete is one conditional UPDATE; CompleteBatch (idem.BatchCompleter)
// applies many completions with the same SET clause and condition in one
// UPDATE ... JOIN statement per table, one round trip for a batch of held
// claims; ExtendBatch (idem.BatchExtender) extends many leases the same way
// (the guard's heartbeat uses it).
//
// Records are keyed by (namespace, SHA-256(key)[:16]) in a BINARY column,
// never by the key text: MariaDB's default collations compare strings
// case-insensitively and ignore trailing spaces. The raw key is stored
// beside the hash and checked on every read.
//
// Transactional use: DoTx (or ClaimTx + CompleteTx on your own *sql.Tx)
// writes the record in the same transaction as the effect, so a rollback
// leaves no record and a duplicate commits nothing.
//
// Layouts (Config.Layout): one table, hash shards, a time-ordered primary
// key for keys that carry their own time (UUIDv7, ULID, Snowflake), and
// daily or weekly RANGE partitions on that time, dropped whole by
// DropExpiredPartitions once every record in them has expired.
//
// The schema is created by Migrate or the cmd/mysqlstore-migrate command;
// Open checks it. See docs/mysqlstore.md for the design and operations.
package mysqlstore
