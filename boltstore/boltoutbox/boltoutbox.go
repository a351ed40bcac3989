package boltoutbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/outbox"
	"go.etcd.io/bbolt"
)

// DefaultBucket is the top-level bucket holding the outbox.
const DefaultBucket = "idem_outbox"

// Config configures an Outbox. DB is required.
type Config struct {
	// DB is the application's bbolt file: the business data and the
	// outbox live in it, so one bbolt transaction writes both.
	DB *bbolt.DB
	// Bucket is the top-level bucket of the outbox (default idem_outbox).
	Bucket string
	// NewID makes the ID of a message enqueued without one, e.g. a
	// snowflake.Generator's NextString. Nil: such messages are refused.
	NewID func() (string, error)
	// Clock defaults to the system clock: one process owns the file, so
	// one clock serves producers and relays.
	Clock idem.Clock
}

// Sub-buckets of the outbox bucket. rows holds the messages by seq; the
// others are indexes kept in the same transactions.
var (
	bRows    = []byte("rows")    // seq -> row
	bIDs     = []byte("ids")     // id -> seq
	bDue     = []byte("due")     // next_attempt_at(8) seq(8), pending rows
	bPending = []byte("pending") // seq, pending rows (the oldest for Stats)
	bKeys    = []byte("keys")    // uvarint len, key, seq(8): pending rows with a key (Ordered)
	bSent    = []byte("sent")    // updated_at(8) seq(8), sent rows (retention)
	bFailed  = []byte("failed")  // seq, failed rows
	bMeta    = []byte("meta")    // counters
	kPending = []byte("pending")
	kFailed  = []byte("failed")
)

// Outbox is an outbox in a bbolt file, for one process (bbolt locks the
// file): Enqueue inside the caller's read-write *bbolt.Tx, and the
// outbox.Backend (with outbox.Notifier) for a relay in the same process.
// Claims are held in memory: a relay that dies takes its process, and its
// claims, with it.
type Outbox struct {
	cfg  Config
	name []byte

	mu   sync.Mutex
	held map[uint64]struct{}

	outbox.Wakers // Listen: woken from tx.OnCommit of enqueuing transactions and by Requeue
}

var (
	_ outbox.Backend  = (*Outbox)(nil)
	_ outbox.Notifier = (*Outbox)(nil)
)

// New creates the outbox's buckets if needed and returns the Outbox.
func New(cfg Config) (*Outbox, error) {
	if cfg.DB == nil {
		return nil, fmt.Errorf("%w: boltoutbox: DB is required", idem.ErrInvalidArgument)
	}
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if cfg.Clock == nil {
		cfg.Clock = idem.SystemClock{}
	}
	o := &Outbox{cfg: cfg, name: []byte(cfg.Bucket), held: map[uint64]struct{}{}}
	err := cfg.DB.Update(func(tx *bbolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists(o.name)
		if err != nil {
			return err
		}
		for _, n := range [][]byte{bRows, bIDs, bDue, bPending, bKeys, bSent, bFailed, bMeta} {
			if _, err := root.CreateBucketIfNotExists(n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: boltoutbox: create buckets: %w", idem.ErrUnavailable, err)
	}
	return o, nil
}

type buckets struct {
	rows, ids, due, pending, keys, sent, failed, meta *bbolt.Bucket
}

func (o *Outbox) buckets(tx *bbolt.Tx) (buckets, error) {
	root := tx.Bucket(o.name)
	if root == nil {
		return buckets{}, fmt.Errorf("%w: boltoutbox: bucket %q missing (New creates it)", idem.ErrInvalidArgument, o.name)
	}
	return buckets{root.Bucket(bRows), root.Bucket(bIDs), root.Bucket(bDue), root.Bucket(bPending), root.Bucket(bKeys),
		root.Bucket(bSent), root.Bucket(bFailed), root.Bucket(bMeta)}, nil
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func timeSeq(t int64, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(t)), seq)
}

func keyPrefix(key []byte) []byte {
	return append(binary.AppendUvarint(make([]byte, 0, len(key)+10), uint64(len(key))), key...)
}

func (b buckets) count(name []byte, delta int64) error {
	var v int64
	if old := b.meta.Get(name); len(old) == 8 {
		v = int64(binary.BigEndian.Uint64(old))
	}
	return b.meta.Put(name, u64(uint64(v+delta)))
}

func (b buckets) counter(name []byte) int64 {
	if v := b.meta.Get(name); len(v) == 8 {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

// put writes r (new or changed from old) and moves its index entries.
func (b buckets) put(seq uint64, old, r *row) error {
	if old != nil {
		switch old.status {
		case outbox.StatusPending:
			if err := b.unindexPending(seq, old); err != nil {
				return err
			}
		case outbox.StatusSent:
			if err := b.sent.Delete(timeSeq(old.updated, seq)); err != nil {
				return err
			}
		case outbox.StatusFailed:
			if err := b.failed.Delete(u64(seq)); err != nil {
				return err
			}
			if err := b.count(kFailed, -1); err != nil {
				return err
			}
		}
	}
	var err error
	switch r.status {
	case outbox.StatusPending:
		if err = b.due.Put(timeSeq(r.next, seq), nil); err == nil {
			err = b.pending.Put(u64(seq), nil)
		}
		if err == nil && len(r.key) > 0 {
			err = b.keys.Put(append(keyPrefix(r.key), u64(seq)...), nil)
		}
		if err == nil {
			err = b.count(kPending, 1)
		}
	case outbox.StatusSent:
		err = b.sent.Put(timeSeq(r.updated, seq), nil)
	case outbox.StatusFailed:
		if err = b.failed.Put(u64(seq), nil); err == nil {
			err = b.count(kFailed, 1)
		}
	}
	if err != nil {
		return err
	}
	return b.rows.Put(u64(seq), r.encode())
}

func (b buckets) unindexPending(seq uint64, r *row) error {
	if err := b.due.Delete(timeSeq(r.next, seq)); err != nil {
		return err
	}
	if err := b.pending.Delete(u64(seq)); err != nil {
		return err
	}
	if len(r.key) > 0 {
		if err := b.keys.Delete(append(keyPrefix(r.key), u64(seq)...)); err != nil {
			return err
		}
	}
	return b.count(kPending, -1)
}

func (b buckets) load(seq uint64) (*row, error) {
	v := b.rows.Get(u64(seq))
	if v == nil {
		return nil, nil
	}
	r, err := decodeRow(v)
	if err != nil {
		return nil, fmt.Errorf("boltoutbox: row %d: %w", seq, err)
	}
	return r, nil
}

// Enqueue writes msgs into the outbox inside the caller's read-write
// transaction tx and returns their IDs (made by Config.NewID where empty).
// They become visible to the relay when tx commits (which wakes it), and
// vanish if it rolls back. Invalid messages fail with
// idem.ErrInvalidArgument before anything is written; an ID already in the
// outbox fails with outbox.ErrDuplicateID (the messages of this call are
// then not written; tx goes on).
func (o *Outbox) Enqueue(ctx context.Context, tx *bbolt.Tx, msgs ...outbox.Message) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !tx.Writable() {
		return nil, fmt.Errorf("%w: boltoutbox: Enqueue needs a read-write transaction", idem.ErrInvalidArgument)
	}
	prepared := make([]outbox.Message, len(msgs))
	hdrs := make([][]byte, len(msgs))
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		p, hdr, err := outbox.Prepare(ctx, m, o.cfg.NewID)
		if err != nil {
			return nil, err
		}
		prepared[i], hdrs[i], ids[i] = p, hdr, p.ID
	}
	b, err := o.buckets(tx)
	if err != nil {
		return nil, err
	}
	for i, id := range ids {
		if b.ids.Get([]byte(id)) != nil || indexOf(ids[:i], id) >= 0 {
			return nil, fmt.Errorf("%w: %q", outbox.ErrDuplicateID, id)
		}
	}
	now := o.cfg.Clock.Now().UnixNano()
	for i, m := range prepared {
		seq, err := b.rows.NextSequence()
		if err != nil {
			return nil, err
		}
		r := &row{status: outbox.StatusPending, next: now, created: now, updated: now,
			id: []byte(m.ID), topic: []byte(m.Topic), key: m.Key, headers: hdrs[i], payload: m.Payload}
		if err := b.put(seq, nil, r); err != nil {
			return nil, err
		}
		if err := b.ids.Put([]byte(m.ID), u64(seq)); err != nil {
			return nil, err
		}
	}
	if len(msgs) > 0 {
		tx.OnCommit(o.Wake)
	}
	return ids, nil
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func (o *Outbox) now(t time.Time) int64 {
	if t.IsZero() {
		t = o.cfg.Clock.Now()
	}
	return t.UnixNano()
}

// Claim implements outbox.Backend. Claims are serialized within the process
// (they are cheap reads); the rows they return are held in memory until
// Settle or Release.
func (o *Outbox) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.Batch, error) {
	if req.Limit < 1 {
		return nil, fmt.Errorf("%w: boltoutbox: claim limit %d < 1", idem.ErrInvalidArgument, req.Limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := o.now(req.Now)
	bt := &batch{o: o, seqs: map[uint64]struct{}{}}
	o.mu.Lock()
	defer o.mu.Unlock()
	err := o.cfg.DB.View(func(tx *bbolt.Tx) error {
		b, err := o.buckets(tx)
		if err != nil {
			return err
		}
		c := b.due.Cursor()
		for k, _ := c.First(); k != nil && len(bt.rows) < req.Limit; k, _ = c.Next() {
			if int64(binary.BigEndian.Uint64(k[:8])) > now {
				break
			}
			seq := binary.BigEndian.Uint64(k[8:])
			if _, held := o.held[seq]; held {
				continue
			}
			r, err := b.load(seq)
			if err != nil {
				return err
			}
			if r == nil {
				return fmt.Errorf("boltoutbox: due index names missing row %d", seq)
			}
			if req.Ordered && len(r.key) > 0 {
				// The key's head is its smallest pending seq.
				p := keyPrefix(r.key)
				hk, _ := b.keys.Cursor().Seek(p)
				if hk == nil || !bytes.HasPrefix(hk, p) || binary.BigEndian.Uint64(hk[len(p):]) != seq {
					continue
				}
			}
			bt.seqs[seq] = struct{}{}
			bt.rows = append(bt.rows, r.outboxRow(seq))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: boltoutbox: claim: %w", idem.ErrUnavailable, err)
	}
	for seq := range bt.seqs {
		o.held[seq] = struct{}{}
	}
	if len(bt.rows) == 0 {
		bt.done = true
	}
	return bt, nil
}

type batch struct {
	o    *Outbox
	rows []outbox.Row
	seqs map[uint64]struct{}
	done bool
}

func (b *batch) Rows() []outbox.Row { return b.rows }

// Settle implements outbox.Batch: one read-write transaction.
func (b *batch) Settle(ctx context.Context, s outbox.Settlement) error {
	o := b.o
	o.mu.Lock()
	done := b.done
	o.mu.Unlock()
	if done {
		return outbox.ErrBatchEnded
	}
	if err := s.Check(func(seq int64) bool { _, ok := b.seqs[uint64(seq)]; return ok }); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := o.now(s.Now)
	err := o.cfg.DB.Update(func(tx *bbolt.Tx) error {
		bk, err := o.buckets(tx)
		if err != nil {
			return err
		}
		apply := func(seq int64, st outbox.Status, next int64, errText string) error {
			old, err := bk.load(uint64(seq))
			if err != nil || old == nil {
				return errors.Join(err, fmt.Errorf("boltoutbox: claimed row %d missing", seq))
			}
			r := *old
			r.status, r.updated, r.attempts = st, now, old.attempts+1
			if st == outbox.StatusPending {
				r.next = next
			}
			if st != outbox.StatusSent {
				r.lastErr = []byte(outbox.TruncateError(errText))
			}
			return bk.put(uint64(seq), old, &r)
		}
		for _, seq := range s.Sent {
			if err := apply(seq, outbox.StatusSent, 0, ""); err != nil {
				return err
			}
		}
		for _, r := range s.Retry {
			if err := apply(r.Seq, outbox.StatusPending, now+int64(r.Delay), r.Err); err != nil {
				return err
			}
		}
		for _, f := range s.Failed {
			if err := apply(f.Seq, outbox.StatusFailed, 0, f.Err); err != nil {
				return err
			}
		}
		return nil
	})
	b.end() // applied or rolled back: either way the claim is over
	if err != nil {
		return fmt.Errorf("%w: boltoutbox: settle: %w", idem.ErrUnavailable, err)
	}
	return nil
}

func (b *batch) end() {
	b.o.mu.Lock()
	defer b.o.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	for seq := range b.seqs {
		delete(b.o.held, seq)
	}
}

// Release implements outbox.Batch.
func (b *batch) Release(context.Context) error { b.end(); return nil }

// PurgeSent implements outbox.Backend: one transaction of at most limit
// deletions.
func (o *Outbox) PurgeSent(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 1 {
		return 0, fmt.Errorf("%w: boltoutbox: purge limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	cut := before.UnixNano()
	err := o.cfg.DB.Update(func(tx *bbolt.Tx) error {
		b, err := o.buckets(tx)
		if err != nil {
			return err
		}
		var victims [][]byte
		c := b.sent.Cursor()
		for k, _ := c.First(); k != nil && len(victims) < limit && int64(binary.BigEndian.Uint64(k[:8])) < cut; k, _ = c.Next() {
			victims = append(victims, bytes.Clone(k))
		}
		for _, k := range victims {
			seq := binary.BigEndian.Uint64(k[8:])
			r, err := b.load(seq)
			if err != nil {
				return err
			}
			if err := b.sent.Delete(k); err != nil {
				return err
			}
			if r != nil {
				if err := b.ids.Delete(r.id); err != nil {
					return err
				}
				if err := b.rows.Delete(u64(seq)); err != nil {
					return err
				}
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w: boltoutbox: purge: %w", idem.ErrUnavailable, err)
	}
	return n, nil
}

// Stats implements outbox.Backend.
func (o *Outbox) Stats(ctx context.Context) (outbox.Stats, error) {
	if err := ctx.Err(); err != nil {
		return outbox.Stats{}, err
	}
	s := outbox.Stats{At: o.cfg.Clock.Now()}
	err := o.cfg.DB.View(func(tx *bbolt.Tx) error {
		b, err := o.buckets(tx)
		if err != nil {
			return err
		}
		s.Pending, s.Failed = b.counter(kPending), b.counter(kFailed)
		if k, _ := b.pending.Cursor().First(); k != nil {
			r, err := b.load(binary.BigEndian.Uint64(k))
			if err != nil {
				return err
			}
			if r != nil {
				s.OldestPending = time.Unix(0, r.created)
			}
		}
		return nil
	})
	if err != nil {
		return outbox.Stats{}, fmt.Errorf("%w: boltoutbox: stats: %w", idem.ErrUnavailable, err)
	}
	return s, nil
}

// ListFailed implements outbox.Backend.
func (o *Outbox) ListFailed(ctx context.Context, afterSeq int64, limit int) ([]outbox.Row, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: boltoutbox: list limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []outbox.Row
	err := o.cfg.DB.View(func(tx *bbolt.Tx) error {
		b, err := o.buckets(tx)
		if err != nil {
			return err
		}
		c := b.failed.Cursor()
		for k, _ := c.Seek(u64(uint64(max(afterSeq, 0) + 1))); k != nil && len(out) < limit; k, _ = c.Next() {
			seq := binary.BigEndian.Uint64(k)
			r, err := b.load(seq)
			if err != nil {
				return err
			}
			if r != nil {
				out = append(out, r.outboxRow(seq))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: boltoutbox: list failed: %w", idem.ErrUnavailable, err)
	}
	return out, nil
}

// Requeue implements outbox.Backend (and wakes the relay).
func (o *Outbox) Requeue(ctx context.Context, ids []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	now := o.cfg.Clock.Now().UnixNano()
	err := o.cfg.DB.Update(func(tx *bbolt.Tx) error {
		b, err := o.buckets(tx)
		if err != nil {
			return err
		}
		for _, id := range ids {
			v := b.ids.Get([]byte(id))
			if len(v) != 8 {
				continue
			}
			seq := binary.BigEndian.Uint64(v)
			old, err := b.load(seq)
			if err != nil {
				return err
			}
			if old == nil || old.status != outbox.StatusFailed {
				continue
			}
			r := *old
			r.status, r.attempts, r.next, r.updated = outbox.StatusPending, 0, now, now
			if err := b.put(seq, old, &r); err != nil {
				return err
			}
			n++
		}
		if n > 0 {
			tx.OnCommit(o.Wake)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w: boltoutbox: requeue: %w", idem.ErrUnavailable, err)
	}
	return n, nil
}
