package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
)

// TestCoalesceCancel cancels half of many concurrent coalesced claims at
// random points. A claim that returns its context's error must have stored
// nothing; one that returns ErrUnknownOutcome may have; one that succeeds
// must be on record with its token; a key claimed by two callers at once is
// acquired exactly once.
func TestCoalesceCancel(t *testing.T) {
	c := sharedClient(t)
	prefix := uniquePrefix()
	t.Cleanup(func() { redistest.DropPrefix(t, c, prefix) })
	s := mustNew(t, redisstore.Config{Client: c, Prefix: prefix, CoalesceInFlight: 3})
	bg := context.Background()
	const n = 400
	type out struct {
		key string
		c   idem.Claim
		err error
	}
	outs := make([]out, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			if i%2 == 1 {
				go cancel() // races with the send
			}
			key := "k" + strconv.Itoa(i/4) // two uncancelled callers per key
			if i%2 == 1 {
				key = "c" + strconv.Itoa(i) // cancelled callers have their own
			}
			cl, err := s.Claim(ctx, claimReq(key))
			outs[i] = out{key, cl, err}
		})
	}
	wg.Wait()
	acquired := map[string]int{}
	var ok, unknown, cancelled int
	for _, o := range outs {
		switch {
		case o.err == nil:
			ok++
		case errors.Is(o.err, idem.ErrUnknownOutcome):
			unknown++
		case errors.Is(o.err, context.Canceled):
			cancelled++
		}
	}
	t.Logf("%d answered, %d unknown (cancelled after sending), %d cancelled before sending", ok, unknown, cancelled)
	for i, o := range outs {
		switch {
		case o.err == nil:
			if o.c.Outcome == idem.OutcomeAcquired {
				acquired[o.key]++
				r, err := s.Get(bg, []byte(o.key))
				if err != nil || r.Token != o.c.Record.Token {
					t.Fatalf("caller %d acquired %q with token %d, record %+v %v", i, o.key, o.c.Record.Token, r, err)
				}
			} else if o.c.Outcome != idem.OutcomeInProgress {
				t.Fatalf("caller %d: outcome %v", i, o.c.Outcome)
			}
		case errors.Is(o.err, idem.ErrUnknownOutcome):
		case errors.Is(o.err, context.Canceled):
			if i%2 == 0 {
				t.Fatalf("caller %d was never cancelled: %v", i, o.err)
			}
		default:
			t.Fatalf("caller %d: %v", i, o.err)
		}
	}
	for k, n := range acquired {
		if n > 1 {
			t.Fatalf("%q acquired %d times", k, n)
		}
	}
	// A claim that returned context.Canceled was never sent.
	for i := 1; i < n; i += 2 {
		o := outs[i]
		if errors.Is(o.err, context.Canceled) && !errors.Is(o.err, idem.ErrUnknownOutcome) {
			if _, err := s.Get(bg, []byte(o.key)); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("%q: its claim returned %v, yet Get = %v", o.key, o.err, err)
			}
		}
	}
}
