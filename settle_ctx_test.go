package idem

import (
	"context"
	"testing"
	"time"
)

// A driver may keep a settle round's context after the round (go-sql-driver
// watches it from a goroutine of its own and, once Done is closed, stores
// ctx.Err() in an atomic.Value): a Done channel it was given must stay
// closed and Err must stay non-nil, whatever the guard does with the next
// round. Reusing one context for every round broke both: Err() returned nil
// after Done had closed and the driver panicked ("sync/atomic: store of nil
// value into Value"; chaos store-restart/mysql/kafka, a consumer died).
func TestSettleRoundContextStaysDone(t *testing.T) {
	// A single claim's Held carries its first round's context; a batch
	// claim's does not.
	alone := new(heldAlone)
	alone.rc = &alone.rctx
	for _, h := range []*Held{&alone.Held, new(Held)} {
		h.op.h = h
		roundContextsStayDone(t, &h.op)
	}
}

func roundContextsStayDone(t *testing.T, op *settleOp) {
	parent := context.Background()
	var c *deadlineCtx
	for round := range 3 {
		c = op.roundCtx(round, parent, time.Now().Add(time.Hour))
		done := c.Done() // the driver's watcher takes Done during the round
		c.release()      // the round ends
		// a later round, as settleNow's loop makes
		next := op.roundCtx(round+1, parent, time.Now().Add(time.Hour))
		select {
		case <-done:
		default:
			t.Fatalf("round %d: Done not closed after the round", round)
		}
		if c.Err() == nil {
			t.Fatalf("round %d: Err() nil after Done closed", round)
		}
		if next == c {
			t.Fatalf("round %d: the next round reuses the released context", round)
		}
		next.release()
	}
	// A context released before anyone asked for Done is done too.
	c = op.roundCtx(5, parent, time.Now().Add(time.Hour))
	c.release()
	select {
	case <-c.Done():
	default:
		t.Fatal("Done after release: not closed")
	}
	if c.Err() == nil {
		t.Fatal("Err after release: nil")
	}
}
