// Package redislock is a distributed lock on Redis with owner tokens,
// optional reentrancy, a watchdog and fencing tokens.
//
// Acquire sets the lock key with SET NX PX and an owner token (random unless
// WithOwner gives one) inside a Lua script that also issues a fencing token:
// a number that grows with every acquisition of the same lock name, even
// across expiry. Release and Extend are Lua scripts that act only when the
// caller still owns the lock (owner and fencing token both match), so a
// holder whose lock expired and was taken over cannot release or extend the
// new holder's lock. With Config.Reentrant, the same owner may acquire again
// (a hold count); each acquisition needs its own Release. A watchdog
// (Lock.StartWatchdog) renews the lock while the holder works and stops when
// its context ends or the lock is released.
//
// Each script is sent once (go-redis's retries are off for them, whatever
// the client's MaxRetries): a lost reply returns an error matching
// idem.ErrUnknownOutcome, never a second run (a re-sent release of a
// reentrant lock would count twice; a re-sent acquire would find the lock
// held, by the caller itself). After an unknown acquire, the lock may be
// held by the owner token tried until its TTL ends: pass WithOwner to be
// able to recognise it; after an unknown Release, Extend tells whether the
// hold is still there.
//
// # What a Redis lock cannot do
//
// A Redis lock alone cannot give exactly-once effects. A holder can pause (GC,
// SIGSTOP, a slow disk, a network partition) past its TTL while another
// process takes the lock, and then carry on believing it still holds it; a
// Redis failover can also lose the lock key, so two holders exist at once.
// Neither the TTL, the owner check nor the watchdog prevents this (Martin
// Kleppmann, "How to do distributed locking", 2016). What does is fencing:
// the resource the holder writes to must remember the largest fencing token
// it has seen and reject writes carrying a smaller one. In idem, the
// idempotency store plays that role: its per-key tokens are checked by every
// Complete, Release, Fail and Extend in the same atomic step as the write.
// Use this lock to avoid wasted work, and the store's (or your resource's)
// fencing for correctness.
//
// The fencing counter of a name is kept for Config.FenceRetention after the
// last acquisition (a counter per name kept forever would leak memory), and a
// new fencing token is max(counter+1, server time in µs), so tokens keep
// growing after the counter expires as long as the server clock does not
// step back further than the time since the last acquisition.
package redislock
