package consumer

import (
	"context"
	"testing"
	"time"
)

// A waiter is woken once the room it waits for is free, not by every
// release below it (the fetch loop waited for a quarter of the window and
// was woken by each of the messages settled one by one).
func TestWindowWakesWaiterAtItsLowMark(t *testing.T) {
	w := newWindow(8)
	if n, err := w.acquire(context.Background(), 1, 8); n != 8 || err != nil {
		t.Fatalf("acquire = %d, %v", n, err)
	}
	got := make(chan int, 1)
	go func() {
		n, _ := w.acquire(context.Background(), 3, 8)
		got <- n
	}()
	var ch chan struct{}
	for ch == nil {
		w.mu.Lock()
		if w.waiting == 1 {
			ch = w.changed
		}
		w.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	w.release(1)
	w.release(1)
	select {
	case <-ch:
		t.Fatal("woken with 2 free slots, waiting for 3")
	default:
	}
	w.release(1)
	<-ch
	// Woken: the releases that follow, until someone waits again, make
	// and close no channel (the fetch loop took a while to run again under
	// load, and every message settled meanwhile woke it once more).
	w.mu.Lock()
	ch = w.changed
	w.mu.Unlock()
	w.release(1)
	select {
	case <-ch:
		t.Fatal("a release closed the channel with nobody waiting on it")
	default:
	}
	if n := <-got; n < 3 {
		t.Fatalf("acquired %d slots, want the 3 or 4 free", n)
	}
}

// Two waiters: the one with the smaller low mark is woken at its mark.
func TestWindowWakesSmallestLowMark(t *testing.T) {
	w := newWindow(8)
	if n, err := w.acquire(context.Background(), 1, 8); n != 8 || err != nil {
		t.Fatalf("acquire = %d, %v", n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	big := make(chan error, 1)
	go func() {
		_, err := w.acquire(ctx, 6, 8)
		big <- err
	}()
	small := make(chan int, 1)
	waitFor := func(n int) {
		for {
			w.mu.Lock()
			k := w.waiting
			w.mu.Unlock()
			if k == n {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(1)
	go func() {
		n, _ := w.acquire(context.Background(), 2, 2)
		small <- n
	}()
	waitFor(2)
	w.release(2)
	if n := <-small; n != 2 {
		t.Fatalf("small waiter got %d", n)
	}
	cancel()
	if err := <-big; err == nil {
		t.Fatal("big waiter acquired, want its context's error")
	}
}
