package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/idem-dev/idem"
)

// backend is one open file shared by the handles of all its namespaces.
type backend struct {
	bolt   *bbolt.DB
	cfg    Config
	queue  chan *op
	stop   chan struct{} // closed by Close
	loop   chan struct{} // closed when the commit loop has exited
	sweep  chan struct{} // closed when the sweeper has exited
	closed atomic.Bool

	// writeErr, once set, refuses every later write: a commit failed in a
	// way that may have left the file and the page cache disagreeing (an
	// fsync error). Reopening clears it.
	writeErr atomic.Pointer[error]
	// readErr, once set, refuses every read of a snapshot newer than
	// durable: a commit failed after bbolt had written its meta page, so
	// the state readers would now see may not be on disk.
	readErr atomic.Pointer[error]

	// durable is the id of the last transaction known to be on disk: its
	// Commit returned, i.e. both of bbolt's fdatasyncs succeeded. bbolt
	// makes a commit visible to new read transactions as soon as it writes
	// the meta page, before the fdatasync that makes it durable; readers
	// (view) never answer from a snapshot newer than durable.
	durable atomic.Uint64
	// committed is closed (and replaced) after every commit attempt, to wake
	// readers waiting for durable to catch up with their snapshot.
	committed atomic.Pointer[chan struct{}]
	// inflight is the commit being made, if any: the one transaction that
	// readers may see before it is durable.
	inflight atomic.Pointer[inflight]

	// beforeCommit, when set (tests), runs just before each Commit; an error
	// from it is handled as a failed commit. readerWaits, when set (tests),
	// runs when a reader waits for a commit's fdatasync.
	beforeCommit func(*bbolt.Tx) error
	readerWaits  func()
	// readUnsynced (benchmarks only) makes readers answer from snapshots
	// whose fdatasync has not returned, as before readers waited: the
	// baseline BenchmarkDuplicateUnderWrites compares against.
	readUnsynced atomic.Bool

	mu     sync.Mutex
	spaces map[string]bool // namespaces whose buckets exist

	commits, committedOps atomic.Int64 // for benchmarks: operations per commit
}

const (
	opPending int32 = iota
	opTaken
	opCancelled
)

// op is one store operation waiting for the commit loop. apply runs inside
// the write transaction; it returns the operation's own answer (nil or a
// contract error such as ErrFenced, which does not stop the commit) and a
// fatal error that aborts the transaction (the others are then re-applied in
// a new one). apply may run more than once and must set its outputs afresh.
type op struct {
	apply func(w *wtx, now int64) (answer, fatal error)
	state atomic.Int32
	done  chan error
}

// inflight is a commit between bbolt's Commit call and its return: its
// transaction id and, per namespace bucket, the keys whose record it writes.
type inflight struct {
	id      uint64
	written map[string]map[string]struct{}
}

// view runs fn in a read transaction whose answer no power cut can
// contradict. bbolt shows a commit to new read transactions as soon as it has
// written the meta page, before the fdatasync that makes it durable. A
// snapshot no newer than durable is used as is; one that holds the commit
// in flight is used only when fn reads the record of one key (key, in
// namespace bucket name) that this commit does not write, since that record
// then reads as in the durable state. Otherwise view waits for the commit
// to end and reads again. If the commit failed after its meta page was
// written, the snapshot's durability is unknown and view fails (readErr)
// until the store is reopened.
func (b *backend) view(ctx context.Context, name, key []byte, fn func(tx *bbolt.Tx) error) error {
	for {
		done := *b.committed.Load()
		tx, err := b.bolt.Begin(false)
		if err != nil {
			return fmt.Errorf("%w: boltstore %s: read: %w", idem.ErrUnavailable, b.cfg.Path, err)
		}
		if id := uint64(tx.ID()); id <= b.durable.Load() || b.readUnsynced.Load() || b.untouched(id, name, key) {
			err = fn(tx)
			_ = tx.Rollback()
			return err
		}
		_ = tx.Rollback()
		if p := b.readErr.Load(); p != nil {
			return *p
		}
		if b.readerWaits != nil {
			b.readerWaits()
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		case <-b.loop:
			return idem.ErrClosed
		}
	}
}

// untouched reports whether transaction id is the commit in flight and it
// does not write the record of key in namespace bucket name.
func (b *backend) untouched(id uint64, name, key []byte) bool {
	f := b.inflight.Load()
	if key == nil || f == nil || f.id != id || b.readErr.Load() != nil {
		return false
	}
	_, w := f.written[string(name)][string(key)]
	return !w
}

// published marks transaction id durable (its Commit returned) and wakes
// the readers waiting for it.
func (b *backend) published(id uint64) {
	if id > b.durable.Load() {
		b.durable.Store(id) // only the commit loop (and Open) stores
	}
	b.inflight.Store(nil)
	b.wake()
}

func (b *backend) wake() {
	next := make(chan struct{})
	close(*b.committed.Swap(&next))
}

func (b *backend) writeDisabled() error {
	if p := b.writeErr.Load(); p != nil {
		return *p
	}
	return nil
}

// do submits an operation and waits until the commit holding it is durable.
func (b *backend) do(ctx context.Context, apply func(w *wtx, now int64) (error, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.closed.Load() {
		return idem.ErrClosed
	}
	if err := b.writeDisabled(); err != nil {
		return err
	}
	o := &op{apply: apply, done: make(chan error, 1)}
	select {
	case b.queue <- o:
	case <-ctx.Done():
		return ctx.Err()
	case <-b.loop:
		return idem.ErrClosed
	}
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		if o.state.CompareAndSwap(opPending, opCancelled) {
			return ctx.Err()
		}
		select {
		case err := <-o.done:
			return err
		default:
		}
		return fmt.Errorf("%w: boltstore: %w while its commit was in flight", idem.ErrUnknownOutcome, ctx.Err())
	case <-b.loop:
		if o.state.CompareAndSwap(opPending, opCancelled) {
			return idem.ErrClosed
		}
		return <-o.done // the loop answers every op it took before exiting
	}
}

// run is the commit loop: it takes every operation queued while the previous
// commit was in flight and applies them in one transaction with one fsync.
// No timer: a lone caller pays one commit, and under load the batch grows to
// whatever arrived during the last fsync.
func (b *backend) run() {
	defer close(b.loop)
	limit := b.cfg.MaxBatch
	if b.cfg.Fsync == FsyncAlways {
		limit = 1
	}
	batch := make([]*op, 0, limit)
	expect, lastCommit, linger := 0, time.Duration(0), b.cfg.MaxLinger
	for {
		select {
		case <-b.stop:
			for {
				select {
				case o := <-b.queue:
					if o.state.CompareAndSwap(opPending, opTaken) {
						o.done <- idem.ErrClosed
					}
				default:
					return
				}
			}
		case o := <-b.queue:
			batch = append(batch[:0], o)
		fill:
			for len(batch) < limit {
				select {
				case o := <-b.queue:
					batch = append(batch, o)
				default:
					break fill
				}
			}
			batch = b.linger(batch, limit, expect, lastCommit, linger)
			start := time.Now()
			b.commit(batch)
			lastCommit = time.Since(start)
			// expect follows the largest recent batch, decaying so that a
			// burst long gone stops making commits wait.
			expect = max(expect-expect/8, len(batch))
			clear(batch)
		}
	}
}

// linger waits a little for more operations when the batch is smaller than
// recent ones. Without it, concurrent callers settle into two cohorts that
// alternate (one queues while the other's commit is in flight), and every
// commit carries half of them. It waits at most a quarter of the last
// commit's duration (capped by Config.MaxLinger) and never when callers
// come one at a time (expect <= 1), so a lone caller pays no delay.
func (b *backend) linger(batch []*op, limit, expect int, lastCommit, cap time.Duration) []*op {
	if len(batch) >= expect || len(batch) >= limit || cap <= 0 {
		return batch
	}
	wait := min(lastCommit/4, cap)
	if wait <= 0 {
		return batch
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for len(batch) < expect && len(batch) < limit {
		select {
		case o := <-b.queue:
			batch = append(batch, o)
		case <-t.C:
			return batch
		case <-b.stop:
			return batch
		}
	}
	return batch
}

func (b *backend) commit(batch []*op) {
	live := make([]*op, 0, len(batch))
	for _, o := range batch {
		if o.state.CompareAndSwap(opPending, opTaken) {
			live = append(live, o)
		}
	}
	answers := make([]error, len(live))
	finish := func(err error) {
		for i, o := range live {
			if err != nil {
				o.done <- err
			} else {
				o.done <- answers[i]
			}
		}
	}
	for len(live) > 0 {
		if err := b.writeDisabled(); err != nil {
			finish(err)
			return
		}
		tx, err := b.bolt.Begin(true)
		if err != nil {
			finish(fmt.Errorf("%w: boltstore %s: begin: %w", idem.ErrUnavailable, b.cfg.Path, err))
			return
		}
		now := b.cfg.Clock.Now().UnixNano()
		w := &wtx{tx: tx}
		bad := -1
		for i, o := range live {
			var fatal error
			if answers[i], fatal = o.apply(w, now); fatal != nil {
				bad = i
				answers[i] = fatal
				break
			}
		}
		if bad < 0 {
			if err := w.flush(); err != nil {
				_ = tx.Rollback()
				finish(fmt.Errorf("%w: boltstore %s: %w", idem.ErrUnavailable, b.cfg.Path, err))
				return
			}
		}
		if bad >= 0 {
			// Drop the failing operation, answer it, re-run the rest.
			_ = tx.Rollback()
			live[bad].done <- answers[bad]
			live = append(live[:bad], live[bad+1:]...)
			answers = append(answers[:bad], answers[bad+1:]...)
			continue
		}
		f := &inflight{id: uint64(tx.ID()), written: make(map[string]map[string]struct{}, len(w.spaces))}
		for name, sp := range w.spaces {
			f.written[name] = sp.written
		}
		b.inflight.Store(f)
		if b.beforeCommit != nil {
			err = b.beforeCommit(tx)
		}
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			err = b.commitFailed(err, b.metaWritten(f.id))
			b.inflight.Store(nil)
			finish(err)
			b.wake()
			return
		}
		b.published(f.id)
		b.commits.Add(1)
		b.committedOps.Add(int64(len(live)))
		finish(nil)
		return
	}
}

// metaWritten reports whether bbolt wrote the meta page of transaction id
// (new read transactions see it) before its commit failed.
func (b *backend) metaWritten(id uint64) bool {
	tx, err := b.bolt.Begin(false)
	if err != nil {
		return true // cannot tell: assume the worst
	}
	defer tx.Rollback()
	return uint64(tx.ID()) >= id
}

// commitFailed maps a failed commit. bbolt commits in this order: grow the
// file (truncate, fsync), write the data pages, fdatasync, write the meta
// page, fdatasync. Running out of space while growing the file or writing
// pages (ENOSPC, EDQUOT, EFBIG from a file-size limit) leaves the file as it
// was: nothing applied, and later commits may succeed once space is freed.
// Any other failure before the meta page (an fdatasync error of any kind,
// ENOSPC included, an I/O error) also applied nothing, but the kernel may
// have dropped pages it reported written: writes are refused until the
// store is reopened, as PostgreSQL does after an fsync failure, while reads
// of the last durable state go on. A failure after the meta page was written
// (its fdatasync) leaves a state readers would see but that may not be on
// disk: the outcome is unknown, and reads are refused too.
func (b *backend) commitFailed(err error, metaWritten bool) error {
	if !metaWritten && spaceBeforeWrite(err) {
		b.cfg.Logger.Error("boltstore: commit failed: disk full; nothing applied", "path", b.cfg.Path, "err", err)
		return fmt.Errorf("%w: boltstore %s: disk full, nothing written: %w", idem.ErrUnavailable, b.cfg.Path, err)
	}
	sticky := fmt.Errorf("%w: boltstore %s: writes disabled after a failed commit (reopen the store once the disk is healthy): %w", idem.ErrUnavailable, b.cfg.Path, err)
	b.writeErr.CompareAndSwap(nil, &sticky)
	if !metaWritten {
		b.cfg.Logger.Error("boltstore: commit failed before its meta page; nothing applied; writes disabled until reopen", "path", b.cfg.Path, "err", err)
		return fmt.Errorf("%w: boltstore %s: commit failed, nothing applied: %w", idem.ErrUnavailable, b.cfg.Path, err)
	}
	unread := fmt.Errorf("%w: boltstore %s: reads refused: a commit failed after its meta page was written, so the current state may not be on disk (reopen the store once the disk is healthy): %w", idem.ErrUnavailable, b.cfg.Path, err)
	b.readErr.CompareAndSwap(nil, &unread)
	b.cfg.Logger.Error("boltstore: commit failed after its meta page; outcome unknown; reads and writes disabled until reopen", "path", b.cfg.Path, "err", err)
	return fmt.Errorf("%w: boltstore %s: commit failed, it may or may not be on disk: %w", idem.ErrUnknownOutcome, b.cfg.Path, err)
}

// spaceBeforeWrite reports a commit error that bbolt met while growing the
// file or writing pages for lack of space, before any fdatasync. bbolt
// returns an fdatasync error as a bare errno and a page write error as an
// *os.PathError "write"; a failed truncate is "file resize error: ..." (not
// wrapped), its fsync "file sync error: ...".
func spaceBeforeWrite(err error) bool {
	if errors.Is(err, bberrors.ErrMaxSizeReached) || strings.HasPrefix(err.Error(), "file resize error") {
		return true
	}
	var pe *os.PathError
	return errors.As(err, &pe) && pe.Op == "write" &&
		(errors.Is(pe.Err, syscall.ENOSPC) || errors.Is(pe.Err, syscall.EDQUOT) || errors.Is(pe.Err, syscall.EFBIG))
}

// ensureNamespace creates the namespace's buckets if the file lacks them.
func (b *backend) ensureNamespace(ns string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.spaces[ns] {
		return nil
	}
	name := []byte(nsPrefix + ns)
	err := b.bolt.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(name) == nil {
			return bberrors.ErrBucketNotFound
		}
		return nil
	})
	if errors.Is(err, bberrors.ErrBucketNotFound) {
		err = b.do(context.Background(), func(w *wtx, _ int64) (error, error) {
			nb, err := w.tx.CreateBucketIfNotExists(name)
			if err != nil {
				return nil, err
			}
			for _, sub := range [][]byte{recordsBucket, expiryBucket, progressIndex} {
				if _, err := nb.CreateBucketIfNotExists(sub); err != nil {
					return nil, err
				}
			}
			return nil, nil
		})
	}
	if err != nil {
		return fmt.Errorf("boltstore %s: namespace %q: %w", b.cfg.Path, ns, err)
	}
	b.spaces[ns] = true
	return nil
}

// sweeper purges expired records of every namespace, SweepChunk records per
// transaction, each transaction queued with the claims like any operation.
func (b *backend) sweeper() {
	defer close(b.sweep)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(b.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		var names []string
		err := b.bolt.View(func(tx *bbolt.Tx) error {
			return tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
				if strings.HasPrefix(string(name), nsPrefix) {
					names = append(names, string(name))
				}
				return nil
			})
		})
		for _, name := range names {
			if err != nil {
				break
			}
			var n int
			n, err = b.purge(ctx, []byte(name), 0)
			if n > 0 {
				b.cfg.Logger.Debug("boltstore: swept expired records", "path", b.cfg.Path, "namespace", name[len(nsPrefix):], "removed", n)
			}
		}
		if err != nil && ctx.Err() == nil {
			b.cfg.Logger.Warn("boltstore: sweep failed", "path", b.cfg.Path, "err", err)
		}
	}
}

// purge removes up to limit (<= 0: all) expired records of one namespace in
// transactions that examine at most SweepChunk index entries each.
func (b *backend) purge(ctx context.Context, name []byte, limit int) (int, error) {
	total, damaged := 0, 0
	var from []byte
	defer func() {
		if damaged > 0 {
			b.cfg.Logger.Warn("boltstore: purge left records it cannot decode", "path", b.cfg.Path, "namespace", string(name[len(nsPrefix):]), "damaged", damaged)
		}
	}()
	for limit <= 0 || total < limit {
		chunk := b.cfg.SweepChunk
		if limit > 0 {
			chunk = min(chunk, limit-total)
		}
		var res purgeResult
		err := b.do(ctx, func(w *wtx, now int64) (error, error) {
			var err error
			res, err = purgeTx(w, name, now, chunk, from)
			return nil, err
		})
		if err != nil {
			return total, err
		}
		total += res.removed
		damaged += res.damaged
		if res.next == nil {
			break
		}
		from = res.next
	}
	return total, nil
}
