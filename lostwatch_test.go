package idem_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
)

// lose makes h lost: its record is deleted and a renew finds it gone.
func lose(t *testing.T, s idem.Store, h *idem.Held) {
	t.Helper()
	if err := s.Delete(ctx, h.Key()); err != nil {
		t.Fatal(err)
	}
	if err := h.Renew(ctx); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("renew of a deleted claim: %v, want ErrLeaseLost", err)
	}
}

func acquireN(t *testing.T, g *idem.Guard, n int) []*idem.Held {
	t.Helper()
	hs := make([]*idem.Held, n)
	for i := range hs {
		h, _, err := g.Acquire(ctx, []byte(fmt.Sprintf("%s-%d", t.Name(), i)))
		if err != nil || h == nil {
			t.Fatalf("acquire: %v", err)
		}
		hs[i] = h
	}
	return hs
}

// AfterLost calls f once, with the index of the first claim lost; a second
// loss calls nothing; nil entries are skipped.
func TestAfterLostReportsFirstLoss(t *testing.T) {
	mem := newMem(t)
	g := newGuard(t, mem, idem.WithHeartbeat(-1))
	hs := acquireN(t, g, 3)
	got := make(chan int, 2)
	stop := idem.AfterLost([]*idem.Held{hs[0], nil, hs[1], hs[2]}, func(i int) { got <- i })
	lose(t, mem, hs[1])
	if i := <-got; i != 2 {
		t.Fatalf("f(%d), want f(2): the index in the slice given", i)
	}
	lose(t, mem, hs[2])
	if stop() {
		t.Fatal("stop after f was called reported it stopped f")
	}
	for _, h := range hs {
		_ = h.Release(ctx, nil)
	}
	select {
	case i := <-got:
		t.Fatalf("f called again, with %d", i)
	default:
	}
}

// A stopped watch calls nothing; a claim lost already fires a new watch at
// once; two watches on one claim both fire.
func TestAfterLostStopAndRegistrations(t *testing.T) {
	mem := newMem(t)
	g := newGuard(t, mem, idem.WithHeartbeat(-1))
	hs := acquireN(t, g, 2)
	var stopped atomic.Int32
	stop := idem.AfterLost(hs, func(int) { stopped.Add(1) })
	if !stop() {
		t.Fatal("stop before any loss: false")
	}
	if stop() {
		t.Fatal("second stop: true")
	}
	a, b := make(chan int, 1), make(chan int, 1)
	idem.AfterLost(hs[1:], func(i int) { a <- i }) // takes the stopped watch's place
	idem.AfterLost(hs, func(i int) { b <- i })     // a second registration on hs[1]
	lose(t, mem, hs[1])
	if i := <-a; i != 0 {
		t.Fatalf("first watch: f(%d), want f(0)", i)
	}
	if i := <-b; i != 1 {
		t.Fatalf("second watch: f(%d), want f(1)", i)
	}
	late := make(chan int, 1)
	idem.AfterLost(hs, func(i int) { late <- i })
	if i := <-late; i != 1 {
		t.Fatalf("watch of a claim lost already: f(%d), want f(1)", i)
	}
	if n := stopped.Load(); n != 0 {
		t.Fatalf("stopped watch called %d times", n)
	}
	_ = hs[0].Release(ctx, nil)
}
