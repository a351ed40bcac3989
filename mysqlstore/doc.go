// Package mysqlstore is an idem.Store on MariaDB (10.5+) or MySQL-compatible
// servers through database/sql and github.com/go-sql-driver/mysql.
//
// A claim is one statement, INSERT ... ON DUPLICATE KEY UPDATE ...
// RETURNING, run in autocommit: the insert-if-absent, the conditional
// takeover (IF() on the row's current state, lease and fingerprint, decided
// under the row lock) and the read-back of the resulting row happen in one
// atomic operation and one round trip. A batch claim is the same statement
// with many rows. Tokens come from a SEQUENCE (<table>_token), so they grow
// per key across expiry, purge and delete.
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
