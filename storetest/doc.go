// Package storetest is the conformance suite every idem.Store runs against
// its real backend:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t testing.TB, ns string) idem.Store {
//			s := mystore.New(... shared backend ..., ns)
//			t.Cleanup(func() { s.Close() })
//			return s
//		}, storetest.Features{Batch: true, Purge: true, List: true, Stats: true,
//			CorruptRecord: damageOneRecord, Maintain: dropOldPartitions})
//	}
//
// It checks the contract written on idem.Store and the optional interfaces:
// atomic claims under contention, exact replay of stored bytes, lease
// expiry and takeover with larger tokens, fencing of stale tokens on every
// method, retention, release and re-claim, fingerprints, key edge cases
// (NUL, invalid UTF-8, case, trailing spaces, the length limit), namespace
// isolation, context cancellation, batch semantics (claims, completions and
// lease extensions, each entry as its single call would be), and a
// linearizability check of random concurrent histories with porcupine.
//
// Two cases check rules of partial failure and maintenance, each driven by
// optional Features fields:
//
//   - BadRecordPerKey (Features.CorruptRecord): a record the store cannot
//     decode makes Get, Claim, Complete, Release, Fail and Extend of that key
//     fail with an error matching idem.ErrCorrupt that names the key and
//     matches neither idem.ErrUnavailable nor idem.ErrUnknownOutcome (also
//     after the store's ClassifyError, if it has one). In ClaimBatch,
//     CompleteBatch and ExtendBatch it is that entry's error; the other
//     entries are applied,
//     and the keys they acquired are held by the returned tokens. Claims of
//     other keys racing claims of the damaged one never fail. Nothing turns
//     the damaged record into a fresh one. CorruptRecord damages one stored
//     record behind the store's back; a store that cannot hold an
//     undecodable record leaves it nil and the case is skipped.
//   - MaintenanceKeepsLiveRecords (Features.Maintain, default Purge(ctx, 0);
//     Features.Keys): maintenance runs in a loop on one Store value while
//     four workers on another Store value of the same namespace claim,
//     complete, extend and read 60 keys with long and short TTLs, and claim
//     the short ones again once they expired (and may have been removed).
//     No record is missing while its retention lasts (judged on the test's
//     clock from when each call started, so a store's own clock may be
//     offset but must run at the same rate), and at the end, after one more
//     maintenance round, every live record is there with its token and a
//     claim of it is not acquired. Keys lets a time-partitioned layout put
//     the keys in old partitions.
//
// It is its own module so that the core keeps no third-party dependency;
// its own tests run it against the memory store.
package storetest
