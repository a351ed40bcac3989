// Package boltstore is the embedded, durable idem.Store: every record lives in
// one bbolt file inside the process, so idem runs with no server and loses
// nothing acknowledged when the process is killed (or, with fsync on every
// commit, which is the only mode offered, when the power fails).
//
// Operations that write go through a commit loop: everything queued while
// one commit is being fsynced is applied, in arrival order, in the next
// transaction and shares its fsync (group commit). An operation returns only
// after the commit holding it is durable; if that commit fails, every
// operation in it fails and none is reported done. ClaimBatch,
// CompleteBatch and ExtendBatch are each one transaction.
//
// One file holds many namespaces (a bucket each); Open returns the handle of
// Config.Namespace and Store.Namespace the others. Tokens come from the
// namespace bucket's persistent sequence, so they grow across expiry, purge,
// delete and restarts. An expiry index lets Purge and the background sweeper
// remove expired records in small transactions at a cost proportional to
// what expired; purging runs alongside claims and never removes a record
// before its ExpiresAt.
//
// No answer depends on a commit that is not on disk: bbolt shows a commit to
// readers when it writes the meta page, one fdatasync before it is durable,
// and readers that would see such a commit for the key they read wait for
// that fdatasync. The store fails closed: a damaged or truncated file is
// refused at Open (ErrCorrupt, naming the file and the problem), a damaged
// record met later is an error of its key alone (idem.ErrCorrupt), a file
// locked by another process gives ErrInUse, a full disk fails the operation
// with idem.ErrUnavailable, and an fdatasync failure of any kind disables
// writes until the store is reopened (reads too, if bbolt had already
// written the failed commit's meta page).
//
// bbolt reuses freed pages but never shrinks the file; Compact copies a
// closed store into a packed file.
//
// See docs/boltstore.md for the file layout and the operational trade-offs.
package boltstore
