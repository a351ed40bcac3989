package consumer

import (
	"context"
	"sync"
)

// window bounds the messages fetched and not yet settled. Fetching waits
// for a low-water mark of free room rather than a single slot, so a busy
// consumer keeps fetching in large batches instead of one message per
// round trip as slots free up one by one.
type window struct {
	mu      sync.Mutex
	used    int
	max     int
	waiting int           // acquire calls waiting on changed
	need    int           // the smallest low of those calls
	changed chan struct{} // closed and replaced once a release frees need slots
}

func newWindow(max int) *window {
	return &window{max: max, changed: make(chan struct{})}
}

// acquire waits until at least low slots are free and takes up to want.
func (w *window) acquire(ctx context.Context, low, want int) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if free := w.max - w.used; free >= low {
			n := min(free, want)
			w.used += n
			return n, nil
		}
		ch := w.changed
		if w.waiting == 0 || low < w.need {
			w.need = low
		}
		w.waiting++
		w.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		w.mu.Lock()
		if ch == w.changed {
			w.waiting-- // not woken: ctx ended
		}
		if err != nil {
			return 0, err
		}
	}
}

// release frees n slots. Waiters are woken only once the room they wait
// for is free: settling a batch releases its slots one message at a time,
// and waking the fetch loop for each (a channel made and closed, a
// goroutine scheduled to find it still too little) cost more than the
// release itself.
func (w *window) release(n int) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	w.used -= n
	if w.waiting > 0 && w.max-w.used >= w.need {
		// Every waiter is woken and waits again, on the new channel,
		// only if there is still too little room: until then the
		// releases that follow have no one to wake.
		close(w.changed)
		w.changed = make(chan struct{})
		w.waiting = 0
	}
	w.mu.Unlock()
}

// take counts n more slots as used without waiting.
func (w *window) take(n int) {
	w.mu.Lock()
	w.used += n
	w.mu.Unlock()
}
