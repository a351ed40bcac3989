// Package snowflake makes 64-bit, time-ordered message ids that are fixed
// before the first send (seed 000): the producer's outbox stores them, the
// broker deduplicates on them, and the consumer's guard keys its records on
// them.
//
// An ID is a non-negative int64: from the top, the milliseconds since the
// layout's epoch, the worker id, and a sequence within the millisecond. The
// default layout (41/10/12 bits from 2020-01-01 UTC) gives 1,024 workers
// 4,096 ids per millisecond each until 2089; Layout changes the epoch and
// the split. Layout.Parse splits an id back into its parts, and
// Layout.KeyTime is the keytime.Func the SQL stores' time-ordered and
// time-partitioned layouts need (for the default layout it equals
// keytime.Snowflake), so records keyed on these ids land at the right edge
// of the index.
//
// A Generator makes the ids of one worker id. Its ids are strictly
// increasing. When the millisecond's sequence is used up it waits for the
// next millisecond. When the wall clock steps back (an NTP correction) by
// at most Config.MaxBackwards (default 100ms) it waits until the clock is
// past the last millisecond used; a larger step is refused with
// ErrClockBackwards until the clock catches up. It never returns the same
// id twice.
//
// Two live generators must not share a worker id. With Config.Store set,
// New leases a free one from any idem.Store (memstore, boltstore,
// redisstore, pgstore, mysqlstore): one record per worker id, claimed,
// extended by a heartbeat and released on Close with the last millisecond
// used, so the next holder of that worker id starts after it. A generator
// whose lease is taken over or removed stops for good (Next returns
// idem.ErrLeaseLost); one that cannot renew stops making ids before its
// lease could have run out, and resumes if a later renewal shows nobody
// took over. After a crash the worker id is free once the lease ends; the
// next holder relies on the clocks of the two hosts agreeing to within the
// lease (NTP), since the crashed one could not say how far it got.
package snowflake
