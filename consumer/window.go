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
	waiting int           // acquire calls waiting for room
	changed chan struct{} // closed and replaced on a release while someone waits
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
		w.waiting++
		w.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		w.mu.Lock()
		w.waiting--
		if err != nil {
			return 0, err
		}
	}
}

func (w *window) release(n int) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	w.used -= n
	if w.waiting > 0 {
		close(w.changed)
		w.changed = make(chan struct{})
	}
	w.mu.Unlock()
}

// take counts n more slots as used without waiting.
func (w *window) take(n int) {
	w.mu.Lock()
	w.used += n
	w.mu.Unlock()
}
