package idem

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// holding is the set of keys this guard is claiming or holds: from the
// moment a claim is sent until it is answered otherwise than acquired, or,
// acquired, until the claim is settled (recorded, refused for good, or
// given up by the background) or lost. A claim of a key in the set by this
// same guard is in progress without asking the store: one guard never has
// two claims of a key outstanding. The holder is alive in this process
// (its handler may be running, its effect applied with the completion in
// flight or retried in the background), so even once its lease has lapsed
// (extends failing or slow, or a claim answered after its whole lease) the
// key must not be taken over here: the effect would run twice. Another
// process still takes a lapsed key over; that is what the lease is for.
// With the heartbeat off (WithHeartbeat < 0: leases alone keep claims
// apart) an acquired claim is in the set only from its Complete or Fail
// on, while this process records an effect it applied.
//
// Sharded by a hash of the key; entries whose keys share a slot (a hash
// collision, or a held key whose claim was taken over while this process
// had not noticed yet) are chained.
type holding struct {
	seed   maphash.Seed
	shards [16]holdShard
	pool   sync.Pool // *holdEntry
}

type holdShard struct {
	mu sync.Mutex
	m  map[uint64]*holdEntry
	_  [40]byte
}

// holdEntry is a key in the set: a claim in flight (h nil), then the
// Held it acquired (Held.hold). Entries are recycled through the pool:
// read them only under the shard's lock.
type holdEntry struct {
	key   []byte
	h     *Held
	hash  uint64
	fp    uint64 // hash of the claim's fingerprint, if hasFP
	hasFP bool
	next  *holdEntry
}

// holder is what a claim of a key in the set learns about it.
type holder struct {
	h     *Held // nil: a claim in flight
	fp    uint64
	hasFP bool
}

func newHolding() *holding {
	s := &holding{seed: maphash.MakeSeed()}
	s.pool.New = func() any { return new(holdEntry) }
	return s
}

func (s *holding) shard(key []byte) (*holdShard, uint64) {
	hash := maphash.Bytes(s.seed, key)
	return s.shardOf(hash), hash
}

func (s *holding) shardOf(hash uint64) *holdShard { return &s.shards[hash%uint64(len(s.shards))] }

// insert chains a new entry for key in sh; sh.mu is held.
func (s *holding) insert(sh *holdShard, hash uint64, key []byte) *holdEntry {
	e := s.pool.Get().(*holdEntry)
	e.key, e.hash = key, hash
	if sh.m == nil {
		sh.m = make(map[uint64]*holdEntry)
	}
	e.next = sh.m[hash]
	sh.m[hash] = e
	return e
}

// release unchains e and returns it to the pool; sh.mu is held.
func (s *holding) release(sh *holdShard, e *holdEntry) {
	if first := sh.m[e.hash]; first == e {
		if e.next == nil {
			delete(sh.m, e.hash)
		} else {
			sh.m[e.hash] = e.next
		}
	} else {
		for p := first; p != nil; p = p.next {
			if p.next == e {
				p.next = e.next
				break
			}
		}
	}
	*e = holdEntry{}
	s.pool.Put(e)
}

// claim registers a claim of key (with fingerprint fp) about to be sent
// and returns its entry; or, when key is in the set already, nil and
// what is there.
func (s *holding) claim(key, fp []byte) (e *holdEntry, cur holder) {
	sh, hash := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for c := sh.m[hash]; c != nil; c = c.next {
		if bytes.Equal(c.key, key) {
			return nil, holder{h: c.h, fp: c.fp, hasFP: c.hasFP}
		}
	}
	e = s.insert(sh, hash, key)
	if len(fp) > 0 {
		e.fp, e.hasFP = maphash.Bytes(s.seed, fp), true
	}
	return e, holder{}
}

// acquired makes claim entry e h's: h is held from now on. (e is the
// caller's claim entry: its hash is read without the lock, set when the
// caller's claim made it.)
func (s *holding) acquired(e *holdEntry, h *Held) {
	sh := s.shardOf(e.hash)
	sh.mu.Lock()
	e.h, h.hold = h, e
	sh.mu.Unlock()
}

// drop ends claim entry e: the claim was not acquired, or is not kept in
// the set (heartbeat off).
func (s *holding) drop(e *holdEntry) {
	sh := s.shardOf(e.hash)
	sh.mu.Lock()
	s.release(sh, e)
	sh.mu.Unlock()
}

// add puts h in the set, if it is not there yet (heartbeat off: from its
// settle on; its fingerprint is not kept).
func (s *holding) add(h *Held) {
	sh, hash := s.shard(h.key)
	sh.mu.Lock()
	if h.hold == nil {
		e := s.insert(sh, hash, h.key)
		e.h, h.hold = h, e
	}
	sh.mu.Unlock()
}

// remove takes h out of the set; it may be called more than once.
func (s *holding) remove(h *Held) {
	sh, _ := s.shard(h.key)
	sh.mu.Lock()
	if e := h.hold; e != nil {
		h.hold = nil
		s.release(sh, e)
	}
	sh.mu.Unlock()
}

// heldHere answers a claim of a key in the set (see holding): in progress
// until the holder's lease ends as last extended or, when that has passed
// or the other claim is still in flight, for bgBackoffMax (ask again after
// the background's next round). A claim with another fingerprint than the
// holder's gets ErrFingerprintMismatch, as from the store (the record
// carries the holder's fingerprint).
func (g *Guard) heldHere(ctx context.Context, req ClaimRequest, cur holder, start time.Time) Acquisition {
	var until time.Time
	lease := req.Lease
	if cur.h != nil {
		if cur.hasFP && len(req.Fingerprint) > 0 && maphash.Bytes(g.holding.seed, req.Fingerprint) != cur.fp {
			err := fmt.Errorf("%w: key %q (held by this process)", ErrFingerprintMismatch, truncKey(req.Key))
			g.onClaim(ctx, req, Claim{}, err, start)
			return Acquisition{Err: err}
		}
		until = cur.h.leaseEnd()
	}
	if !until.After(start) {
		until, lease = start.Add(bgBackoffMax), bgBackoffMax
	}
	c := Claim{Outcome: OutcomeInProgress, Record: Record{Key: req.Key, State: StateInProgress, LeaseUntil: until}}
	g.onClaim(ctx, req, c, nil, start)
	return Acquisition{Err: &InProgressError{Key: req.Key, LeaseUntil: until, Lease: lease}}
}
