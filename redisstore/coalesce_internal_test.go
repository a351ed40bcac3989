package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

// gateHook holds the first script go-redis sends until release is closed,
// and records how many keys every script carried.
type gateHook struct {
	mu      sync.Mutex
	held    bool
	release chan struct{}
	keys    []int
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			n, _ := strconv.Atoi(fmt.Sprint(cmd.Args()[2]))
			h.mu.Lock()
			h.keys = append(h.keys, n)
			first := !h.held
			h.held = true
			h.mu.Unlock()
			if first {
				<-h.release
			}
		}
		return next(ctx, cmd)
	}
}

// TestCoalescedClaimsOneBadRecord: concurrent Claim calls coalesced into
// one script, two of them on damaged records (a corrupt string and a hash:
// WRONGTYPE). Only those two callers get an error (idem.ErrCorrupt); every
// other caller acquires its key. Before the fix the shared script failed
// and every caller got its error (187 of 196 in the audit), while the keys
// written before the bad one stayed in progress, held by nobody.
func TestCoalescedClaimsOneBadRecord(t *testing.T) {
	c, prefix := sharedForInternal(t, "coalbad")
	gate := &gateHook{release: make(chan struct{})}
	c.AddHook(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := New(ctx, Config{Client: c, Prefix: prefix, CoalesceInFlight: 1, SkipChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rk := func(k string) string { r, _ := s.keysOf([]byte(k)); return r }
	if err := c.Set(ctx, rk("bad-str"), "garbage", 10*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, rk("bad-hash"), "s", "p").Err(); err != nil {
		t.Fatal(err)
	}
	c.PExpire(ctx, rk("bad-hash"), 10*time.Minute)

	req := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Lease: time.Minute, TTL: time.Hour}
	}
	// The first claim takes the only in-flight slot and is held at the gate.
	first := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, req("first")); first <- err }()
	for {
		gate.mu.Lock()
		held := gate.held
		gate.mu.Unlock()
		if held {
			break
		}
		time.Sleep(time.Millisecond)
	}
	keys := []string{"bad-str", "bad-hash"}
	for i := range 40 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	type out struct {
		c   idem.Claim
		err error
	}
	outs := make([]out, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			cl, err := s.Claim(ctx, req(k))
			outs[i] = out{cl, err}
		})
	}
	// Wait until every claim is queued behind the held script, then let
	// it go: the queue goes out as one script.
	for {
		s.co.mu.Lock()
		n := len(s.co.queue)
		s.co.mu.Unlock()
		if n == len(keys) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(gate.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("first claim: %v", err)
	}
	gate.mu.Lock()
	scripts := append([]int(nil), gate.keys...)
	gate.mu.Unlock()
	// The first claim's script (and its EVAL after a NOSCRIPT), then one
	// script with the counter and every queued key.
	if len(scripts) < 2 || scripts[len(scripts)-1] != 1+len(keys) {
		t.Fatalf("scripts sent with %v keys, want the last with %d: the claims did not share one script", scripts, 1+len(keys))
	}
	failed := 0
	for i, o := range outs[2:] {
		if o.err != nil || o.c.Outcome != idem.OutcomeAcquired {
			t.Errorf("%s: %v %v: another caller's bad record failed this claim", keys[i+2], o.c.Outcome, o.err)
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d good claims failed", failed, len(keys)-2)
	}
	for i, o := range outs[:2] {
		if !errors.Is(o.err, idem.ErrCorrupt) {
			t.Fatalf("%s: %v %v, want idem.ErrCorrupt", keys[i], o.c.Outcome, o.err)
		}
	}
}
