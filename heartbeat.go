package idem

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// beater extends the leases of all held claims of a guard from one
// goroutine, so holding a claim costs a list insert instead of a timer. The
// goroutine starts with the first held claim and stops after an idle tick
// or at Guard.Close.
type beater struct {
	g        *Guard
	interval time.Duration
	tick     time.Duration
	rr       atomic.Uint32
	shards   [8]beatShard
	mu       sync.Mutex // guards running and stop
	running  bool
	stop     chan struct{}
	done     chan struct{}
	closed   bool
}

type beatShard struct {
	mu   sync.Mutex
	head *Held
	n    int
	_    [40]byte
}

func newBeater(g *Guard, interval time.Duration) *beater {
	return &beater{g: g, interval: interval, tick: max(interval/4, time.Millisecond)}
}

func (b *beater) add(h *Held) {
	h.lastBeat = time.Now()
	i := b.rr.Add(1) % uint32(len(b.shards))
	sh := &b.shards[i]
	h.shard = sh // fixed from here on: beat reads it without a lock
	sh.mu.Lock()
	h.linked = true
	h.next = sh.head
	if sh.head != nil {
		sh.head.prev = h
	}
	sh.head = h
	sh.n++
	sh.mu.Unlock()
	b.mu.Lock()
	if !b.running && !b.closed {
		b.running = true
		b.stop, b.done = make(chan struct{}), make(chan struct{})
		go b.loop(b.stop, b.done)
	}
	b.mu.Unlock()
}

func (b *beater) remove(h *Held) {
	sh := h.shard
	if sh == nil {
		return
	}
	sh.mu.Lock()
	if h.linked {
		if h.prev != nil {
			h.prev.next = h.next
		} else {
			sh.head = h.next
		}
		if h.next != nil {
			h.next.prev = h.prev
		}
		h.prev, h.next, h.linked = nil, nil, false
		sh.n--
	}
	sh.mu.Unlock()
}

func (b *beater) loop(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(b.tick)
	defer t.Stop()
	var due []*Held
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			due = due[:0]
			total := 0
			for i := range b.shards {
				sh := &b.shards[i]
				sh.mu.Lock()
				total += sh.n
				for h := sh.head; h != nil; h = h.next {
					if !h.beating && now.Sub(h.lastBeat) >= b.interval {
						h.beating = true
						due = append(due, h)
					}
				}
				sh.mu.Unlock()
			}
			for _, h := range due {
				go b.beat(h)
			}
			if total == 0 {
				b.mu.Lock()
				if b.idle() {
					b.running = false
					b.mu.Unlock()
					return
				}
				b.mu.Unlock()
			}
		}
	}
}

func (b *beater) idle() bool {
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		n := sh.n
		sh.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

func (b *beater) beat(h *Held) {
	// Half a lease: long enough for a slow store, short enough that a
	// failed beat leaves time for the next before the lease runs out.
	ctx, cancel := context.WithTimeout(context.Background(), max(h.lease/2, b.interval))
	err := b.g.store.Extend(ctx, h.key, h.token, h.lease)
	cancel()
	h.mu.Lock()
	settled := h.settled
	h.mu.Unlock()
	if sh := h.shard; sh != nil {
		sh.mu.Lock()
		h.beating = false
		if err == nil {
			h.lastBeat = time.Now()
		}
		sh.mu.Unlock()
	}
	if settled || err == nil {
		return
	}
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrNotFound) {
		b.remove(h)
		h.markLost(context.Background(), err)
		return
	}
	b.g.log.Warn("idem: lease heartbeat failed; retrying", "key", string(truncKey(h.key)), "err", err)
}

func (b *beater) close() {
	b.mu.Lock()
	b.closed = true
	running, stop, done := b.running, b.stop, b.done
	b.running = false
	b.mu.Unlock()
	if running {
		close(stop)
		<-done
	}
}
