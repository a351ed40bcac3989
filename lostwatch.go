package idem

import (
	"slices"
	"sync/atomic"
)

// AfterLost arranges to call f in its own goroutine once any of hs is lost
// while held (taken over after a lease expiry, or deleted: what closes its
// Done channel), with the index in hs of the first one found lost; at once
// if one is lost already. f runs at most once. Calling the returned stop
// disarms it: stop reports whether it stopped f from being called (false:
// f was called or is being called, or stop was called before), as
// context.AfterFunc's stop does.
//
// It is for code that holds many claims at once, such as a batch consumer
// cancelling its handler when one of its thousand claims is lost: it costs
// no goroutine and no channel per claim, where a select over their Done
// channels makes one channel each and locks them all. A nil entry of hs is
// skipped. Stop it once the claims are settled, or when no longer
// interested; a stopped watch is dropped by the claims as they meet it.
func AfterLost(hs []*Held, f func(i int)) (stop func() bool) {
	w := &lostWatch{f: f}
	for i, h := range hs {
		if h == nil {
			continue
		}
		h.mu.Lock()
		if h.lost {
			h.mu.Unlock()
			w.fireAt(i)
			break
		}
		h.watch.add(w, i)
		h.mu.Unlock()
	}
	return w.stop
}

// lostWatch is one AfterLost call.
type lostWatch struct {
	f     func(int)
	state atomic.Int32 // lostArmed, lostFired, lostStopped
}

const (
	lostArmed = iota
	lostFired
	lostStopped
)

func (w *lostWatch) fireAt(i int) {
	if w.state.CompareAndSwap(lostArmed, lostFired) {
		go w.f(i)
	}
}

func (w *lostWatch) stop() bool { return w.state.CompareAndSwap(lostArmed, lostStopped) }

func (w *lostWatch) armed() bool { return w.state.Load() == lostArmed }

// lostReg is a Held's AfterLost registrations: the first inline (a batch
// consumer's claim has one at a time, and a registration then costs no
// allocation), any more in a slice. Each carries the claim's index in the
// AfterLost call's hs.
type lostReg struct {
	w    *lostWatch
	i    int
	more *[]lostEntry
}

type lostEntry struct {
	w *lostWatch
	i int
}

// add registers w, dropping the registrations that are no longer armed.
func (r *lostReg) add(w *lostWatch, i int) {
	if r.w == nil || !r.w.armed() {
		r.w, r.i = w, i
		return
	}
	if r.more == nil {
		r.more = new([]lostEntry)
	}
	*r.more = slices.DeleteFunc(*r.more, func(e lostEntry) bool { return !e.w.armed() })
	*r.more = append(*r.more, lostEntry{w, i})
}

// fire calls every registration's function (the ones still armed).
func (r lostReg) fire() {
	if r.w != nil {
		r.w.fireAt(r.i)
	}
	if r.more != nil {
		for _, e := range *r.more {
			e.w.fireAt(e.i)
		}
	}
}
