package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/broker"
)

// inflight tracks every delivery from its fetch to its settle and tells
// the broker it is in progress (Acker.InProgress) once it has been in hand
// for InProgressInterval, and again every interval after that: while it
// waits in a worker's queue, while its handler runs, while its completion
// is recorded, and while it is held. One goroutine for all deliveries; a
// delivery costs a list insert and a removal.
type inflight struct {
	c        *Consumer
	interval time.Duration
	rr       atomic.Uint32
	shards   [8]inflightShard
	stop     chan struct{}
	done     chan struct{}

	// The channels of broker.LostNotifier Ackers, one goroutine each
	// (watch): deliveries share them (one per connection or partition).
	watchMu  sync.Mutex
	watched  map[<-chan struct{}]struct{}
	watchers sync.WaitGroup
}

type inflightShard struct {
	mu   sync.Mutex
	head *delivery
	_    [48]byte
}

func newInflight(c *Consumer, interval time.Duration) *inflight {
	return &inflight{c: c, interval: interval}
}

// start runs the signalling goroutine until close.
func (f *inflight) start() {
	f.stop, f.done = make(chan struct{}), make(chan struct{})
	go f.loop()
}

func (f *inflight) close() {
	close(f.stop)
	<-f.done
	f.watchers.Wait()
}

func (f *inflight) add(d *delivery, now time.Time) {
	var lostCh <-chan struct{}
	if ln, ok := d.m.Acker.(broker.LostNotifier); ok {
		lostCh = ln.Lost()
	}
	sh := &f.shards[f.rr.Add(1)%uint32(len(f.shards))]
	sh.mu.Lock()
	d.shard = sh
	d.lostCh = lostCh
	d.lastSignal = now
	d.next = sh.head
	if sh.head != nil {
		sh.head.prev = d
	}
	sh.head = d
	sh.mu.Unlock()
	if lostCh != nil {
		f.watch(d, lostCh)
	}
}

// watch notes d lost if ch is closed already, and otherwise makes sure a
// goroutine waits for ch to close (lostAll).
func (f *inflight) watch(d *delivery, ch <-chan struct{}) {
	select {
	case <-ch:
		f.c.noteLost(d, broker.ErrDeliveryLost, "lost_notifier")
		return
	default:
	}
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	if _, ok := f.watched[ch]; ok {
		return
	}
	if f.watched == nil {
		f.watched = make(map[<-chan struct{}]struct{})
	}
	f.watched[ch] = struct{}{}
	f.watchers.Add(1)
	go func() {
		defer f.watchers.Done()
		select {
		case <-ch:
			f.lostAll(ch)
		case <-f.stop:
		}
		f.watchMu.Lock()
		delete(f.watched, ch)
		f.watchMu.Unlock()
	}()
}

// lostAll notes lost every unsettled delivery whose Lost channel is ch.
func (f *inflight) lostAll(ch <-chan struct{}) {
	var lost []*delivery
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for d := sh.head; d != nil; d = d.next {
			if d.lostCh == ch && !d.settled.Load() {
				lost = append(lost, d)
			}
		}
		sh.mu.Unlock()
	}
	for _, d := range lost {
		f.c.noteLost(d, broker.ErrDeliveryLost, "lost_notifier")
	}
}

func (f *inflight) remove(d *delivery) {
	sh := d.shard
	if sh == nil {
		return
	}
	sh.mu.Lock()
	if d.prev != nil {
		d.prev.next = d.next
	} else if sh.head == d {
		sh.head = d.next
	}
	if d.next != nil {
		d.next.prev = d.prev
	}
	d.prev, d.next, d.shard = nil, nil, nil
	sh.mu.Unlock()
}

// signal sends InProgress for due, all within one interval; failures are
// logged once per round. A delivery the broker reports lost is noted
// (noteLost) and not signalled again.
func (f *inflight) signal(due []*delivery) {
	if len(due) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.interval)
	defer cancel()
	failed := 0
	var first error
	for _, d := range due {
		if d.settled.Load() || d.isLost() {
			continue
		}
		err := d.m.Acker.InProgress(ctx)
		if errors.Is(err, broker.ErrDeliveryLost) {
			f.c.noteLost(d, err, "in_progress")
			continue
		}
		if err != nil {
			if failed == 0 {
				first = err
			}
			failed++
		}
	}
	if failed > 0 {
		f.c.log.Warn("consumer: in-progress signal failed; the broker may redeliver after its ack wait", "deliveries", failed, "of", len(due), "err", first)
	}
}

func (f *inflight) loop() {
	defer close(f.done)
	// Checking four times per interval signals each delivery between one
	// and 1.25 intervals after the last signal.
	t := time.NewTicker(max(f.interval/4, time.Millisecond))
	defer t.Stop()
	var due []*delivery
	for {
		select {
		case <-f.stop:
			return
		case now := <-t.C:
			due = due[:0]
			for i := range f.shards {
				sh := &f.shards[i]
				sh.mu.Lock()
				for d := sh.head; d != nil; d = d.next {
					if now.Sub(d.lastSignal) >= f.interval {
						d.lastSignal = now
						due = append(due, d)
					}
				}
				sh.mu.Unlock()
			}
			f.signal(due)
			clear(due)
		}
	}
}
