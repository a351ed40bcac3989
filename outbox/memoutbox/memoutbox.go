package memoutbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/outbox"
)

// Config configures an Outbox. The zero value is usable.
type Config struct {
	// NewID makes the ID of a message enqueued without one (nil: such
	// messages are refused).
	NewID func() (string, error)
	// Clock defaults to the system clock.
	Clock idem.Clock
}

// Outbox is an in-memory outbox.Backend.
type Outbox struct {
	cfg Config

	mu   sync.Mutex
	seq  int64
	rows map[int64]*outbox.Row
	ids  map[string]int64 // committed and in-flight ids
	held map[int64]bool   // rows in a batch

	outbox.Wakers // Listen: woken by commits and Requeue
}

// New returns an empty outbox.
func New(cfg Config) *Outbox {
	if cfg.Clock == nil {
		cfg.Clock = idem.SystemClock{}
	}
	return &Outbox{cfg: cfg, rows: map[int64]*outbox.Row{}, ids: map[string]int64{}, held: map[int64]bool{}}
}

var _ outbox.Backend = (*Outbox)(nil)
var _ outbox.Notifier = (*Outbox)(nil)

// Tx is a business transaction.
type Tx struct {
	o    *Outbox
	rows []outbox.Row
	done bool
}

// Begin starts a transaction.
func (o *Outbox) Begin() *Tx { return &Tx{o: o} }

// Enqueue adds messages to the transaction and returns their IDs. A
// duplicate ID (committed or in another open transaction) is
// outbox.ErrDuplicateID.
func (tx *Tx) Enqueue(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tx.done {
		return nil, fmt.Errorf("%w: memoutbox: transaction ended", idem.ErrInvalidArgument)
	}
	prepared := make([]outbox.Message, len(msgs))
	for i, m := range msgs {
		p, hdr, err := outbox.Prepare(ctx, m, tx.o.cfg.NewID)
		if err != nil {
			return nil, err
		}
		p.Headers, _ = outbox.DecodeHeaders(hdr) // stored as a backend would: a copy
		p.Key, p.Payload = clone(p.Key), clone(p.Payload)
		prepared[i] = p
	}
	o := tx.o
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := make([]string, len(prepared))
	for i, m := range prepared {
		if _, dup := o.ids[m.ID]; dup {
			return nil, fmt.Errorf("%w: %q", outbox.ErrDuplicateID, m.ID)
		}
		for _, r := range tx.rows {
			if r.ID == m.ID {
				return nil, fmt.Errorf("%w: %q", outbox.ErrDuplicateID, m.ID)
			}
		}
		ids[i] = m.ID
	}
	now := o.cfg.Clock.Now()
	for _, m := range prepared {
		o.seq++
		o.ids[m.ID] = -o.seq // reserved until commit or rollback
		tx.rows = append(tx.rows, outbox.Row{Message: m, Seq: o.seq, Status: outbox.StatusPending,
			NextAttemptAt: now, CreatedAt: now, UpdatedAt: now})
	}
	return ids, nil
}

// Commit makes the transaction's messages visible and wakes listeners.
func (tx *Tx) Commit() error {
	if tx.done {
		return fmt.Errorf("%w: memoutbox: transaction ended", idem.ErrInvalidArgument)
	}
	tx.done = true
	o := tx.o
	o.mu.Lock()
	for i := range tx.rows {
		r := tx.rows[i]
		o.rows[r.Seq] = &r
		o.ids[r.ID] = r.Seq
	}
	o.mu.Unlock()
	if len(tx.rows) > 0 {
		o.Wake()
	}
	return nil
}

// Rollback drops the transaction's messages.
func (tx *Tx) Rollback() {
	if tx.done {
		return
	}
	tx.done = true
	tx.o.mu.Lock()
	defer tx.o.mu.Unlock()
	for _, r := range tx.rows {
		delete(tx.o.ids, r.ID)
	}
}

// Enqueue is Begin, Enqueue and Commit in one.
func (o *Outbox) Enqueue(ctx context.Context, msgs ...outbox.Message) ([]string, error) {
	tx := o.Begin()
	ids, err := tx.Enqueue(ctx, msgs...)
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	return ids, tx.Commit()
}

func (o *Outbox) now(t time.Time) time.Time {
	if t.IsZero() {
		return o.cfg.Clock.Now()
	}
	return t
}

// Claim implements outbox.Backend.
func (o *Outbox) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.Batch, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.Limit < 1 {
		return nil, fmt.Errorf("%w: memoutbox: claim limit %d < 1", idem.ErrInvalidArgument, req.Limit)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now(req.Now)
	var blocked map[string]int64 // key -> smallest pending seq, for Ordered
	if req.Ordered {
		blocked = map[string]int64{}
		for _, r := range o.rows {
			if r.Status == outbox.StatusPending && len(r.Key) > 0 {
				if s, ok := blocked[string(r.Key)]; !ok || r.Seq < s {
					blocked[string(r.Key)] = r.Seq
				}
			}
		}
	}
	var due []*outbox.Row
	for _, r := range o.rows {
		if r.Status != outbox.StatusPending || o.held[r.Seq] || r.NextAttemptAt.After(now) {
			continue
		}
		if req.Ordered && len(r.Key) > 0 && blocked[string(r.Key)] != r.Seq {
			continue
		}
		due = append(due, r)
	}
	slices.SortFunc(due, func(a, b *outbox.Row) int {
		if c := a.NextAttemptAt.Compare(b.NextAttemptAt); c != 0 {
			return c
		}
		return int(a.Seq - b.Seq)
	})
	if len(due) > req.Limit {
		due = due[:req.Limit]
	}
	b := &batch{o: o, seqs: map[int64]bool{}}
	for _, r := range due {
		o.held[r.Seq] = true
		b.seqs[r.Seq] = true
		b.rows = append(b.rows, copyRow(r))
	}
	return b, nil
}

type batch struct {
	o    *Outbox
	rows []outbox.Row
	seqs map[int64]bool
	done bool
}

func (b *batch) Rows() []outbox.Row { return b.rows }

func (b *batch) Settle(ctx context.Context, s outbox.Settlement) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := b.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.done {
		return outbox.ErrBatchEnded
	}
	if err := s.Check(func(seq int64) bool { return b.seqs[seq] }); err != nil {
		return err
	}
	now := o.now(s.Now)
	touch := func(seq int64, st outbox.Status, errText string) *outbox.Row {
		r := o.rows[seq]
		r.Status, r.UpdatedAt = st, now
		r.Attempts++
		if st != outbox.StatusSent {
			r.LastError = outbox.TruncateError(errText)
		}
		return r
	}
	for _, seq := range s.Sent {
		touch(seq, outbox.StatusSent, "")
	}
	for _, rt := range s.Retry {
		touch(rt.Seq, outbox.StatusPending, rt.Err).NextAttemptAt = now.Add(rt.Delay)
	}
	for _, f := range s.Failed {
		touch(f.Seq, outbox.StatusFailed, f.Err)
	}
	b.endLocked()
	return nil
}

func (b *batch) Release(ctx context.Context) error {
	b.o.mu.Lock()
	defer b.o.mu.Unlock()
	b.endLocked()
	return nil
}

func (b *batch) endLocked() {
	if b.done {
		return
	}
	b.done = true
	for seq := range b.seqs {
		delete(b.o.held, seq)
	}
}

// PurgeSent implements outbox.Backend.
func (o *Outbox) PurgeSent(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit < 1 {
		return 0, fmt.Errorf("%w: memoutbox: purge limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for seq, r := range o.rows {
		if n == limit {
			break
		}
		if r.Status == outbox.StatusSent && r.UpdatedAt.Before(before) && !o.held[seq] {
			delete(o.rows, seq)
			delete(o.ids, r.ID)
			n++
		}
	}
	return n, nil
}

// Stats implements outbox.Backend.
func (o *Outbox) Stats(ctx context.Context) (outbox.Stats, error) {
	if err := ctx.Err(); err != nil {
		return outbox.Stats{}, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s := outbox.Stats{At: o.cfg.Clock.Now()}
	for _, r := range o.rows {
		switch r.Status {
		case outbox.StatusPending:
			s.Pending++
			if s.OldestPending.IsZero() || r.CreatedAt.Before(s.OldestPending) {
				s.OldestPending = r.CreatedAt
			}
		case outbox.StatusFailed:
			s.Failed++
		}
	}
	return s, nil
}

// ListFailed implements outbox.Backend.
func (o *Outbox) ListFailed(ctx context.Context, afterSeq int64, limit int) ([]outbox.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: memoutbox: list limit %d < 1", idem.ErrInvalidArgument, limit)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []outbox.Row
	for _, r := range o.rows {
		if r.Status == outbox.StatusFailed && r.Seq > afterSeq {
			out = append(out, copyRow(r))
		}
	}
	slices.SortFunc(out, func(a, b outbox.Row) int { return int(a.Seq - b.Seq) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Requeue implements outbox.Backend.
func (o *Outbox) Requeue(ctx context.Context, ids []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	o.mu.Lock()
	n := 0
	now := o.cfg.Clock.Now()
	for _, id := range ids {
		seq, ok := o.ids[id]
		if !ok || seq < 0 {
			continue
		}
		if r := o.rows[seq]; r.Status == outbox.StatusFailed {
			r.Status, r.Attempts, r.NextAttemptAt, r.UpdatedAt = outbox.StatusPending, 0, now, now
			n++
		}
	}
	o.mu.Unlock()
	if n > 0 {
		o.Wake()
	}
	return n, nil
}

func copyRow(r *outbox.Row) outbox.Row {
	c := *r
	c.Key, c.Payload = clone(r.Key), clone(r.Payload)
	if r.Headers != nil {
		c.Headers = make(map[string]string, len(r.Headers))
		for k, v := range r.Headers {
			c.Headers[k] = v
		}
	}
	return c
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
