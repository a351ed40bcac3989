package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// What MaintenanceKeepsLiveRecords does with each key, by i % 3.
const (
	maintLong   = iota // claimed and completed with a long TTL
	maintShort         // claimed with a short TTL (half of them completed), left to expire, then claimed again with a long TTL
	maintExtend        // claimed with a short lease and TTL, then extended to a long lease
)

// maintKey is what a worker knows about one key. Times are on the test's
// clock: a store may use another clock, but both advance at the same rate,
// so "the store applied X before the call returned at t" bounds hold.
type maintKey struct {
	key    []byte
	kind   int
	token  uint64
	state  idem.State
	result string
	// liveUntil: the record certainly exists until then (the last change
	// was applied after the call started, with this much retention).
	liveUntil time.Time
	// goneAfter: the record has certainly expired after then.
	goneAfter time.Time
	lost      bool // expired before the worker could extend it (a slow machine): not checked
}

// testMaintenance: maintenance (Features.Maintain, by default Purge) run in
// a loop on one Store value never removes a record before its ExpiresAt,
// while another Store value of the same namespace claims, completes,
// extends and reads keys with long and short TTLs, and claims keys again
// whose records expired (and may have been removed). At the end every
// record still within its retention is there with its token, and claiming
// it does not acquire it: that would be a duplicate effect.
func (s *suite) testMaintenance(t *testing.T) {
	ns := NewNamespace()
	worker, maint := s.f(t, ns), s.f(t, ns)
	run := s.feat.Maintain
	if run == nil {
		if _, ok := maint.(idem.Purger); !ok {
			t.Skip("Features.Maintain unset and the store is not an idem.Purger: no maintenance to run")
		}
		run = func(ctx context.Context, st idem.Store) error {
			_, err := st.(idem.Purger).Purge(ctx, 0)
			return err
		}
	}
	keyOf := s.feat.Keys
	if keyOf == nil {
		keyOf = func(i int) []byte { return []byte(fmt.Sprintf("maint-%d", i)) }
	}
	const workers, perWorker = 4, 15
	keys := make([][]*maintKey, workers)
	seen := map[string]bool{}
	for i := 0; i < workers*perWorker; i++ {
		k := keyOf(i)
		if err := idem.ValidateKey(k); err != nil {
			t.Fatalf("Features.Keys(%d): %v", i, err)
		}
		if seen[string(k)] {
			t.Fatalf("Features.Keys(%d) = %q repeats an earlier key", i, k)
		}
		seen[string(k)] = true
		keys[i%workers] = append(keys[i%workers], &maintKey{key: k, kind: i % 3})
	}

	ctx := ctxT(t)
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	var rounds atomic.Int64
	mdone := make(chan struct{})
	go func() {
		defer close(mdone)
		for mctx.Err() == nil {
			if err := run(mctx, maint); err != nil {
				if mctx.Err() == nil {
					t.Errorf("maintenance round %d: %v", rounds.Load()+1, err)
				}
				return
			}
			rounds.Add(1)
			time.Sleep(time.Millisecond) // a no-op round (Redis's expiry is the server's) must not spin
		}
	}()

	m := &maintWorker{s: s, st: worker, u: s.feat.LeaseUnit}
	m.pass(t, keys, m.first)
	// Wait until every short record has expired, then claim them again
	// while maintenance may be removing them.
	var last time.Time
	for _, ks := range keys {
		for _, k := range ks {
			if k.kind == maintShort && k.goneAfter.After(last) {
				last = k.goneAfter
			}
		}
	}
	time.Sleep(time.Until(last) + m.u)
	m.pass(t, keys, m.second)
	stop()
	<-mdone
	if t.Failed() {
		t.FailNow()
	}
	// One more round on the final state, then check every live record.
	mustOK(t, "final maintenance round", run(ctx, maint))
	t.Logf("%d maintenance rounds ran concurrently with the workers; %d records expired before the worker's next step could reach them (a slow machine, not checked at that step)", rounds.Load(), m.late.Load())
	for _, ks := range keys {
		for _, k := range ks {
			if k.lost || !time.Now().Before(k.liveUntil) {
				continue
			}
			r, err := worker.Get(ctx, k.key)
			if errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("%q (%s, token %d) is missing after maintenance, though its retention has not ended", k.key, k.state, k.token)
			}
			mustOK(t, fmt.Sprintf("Get(%q) after maintenance", k.key), err)
			if r.Token != k.token || r.State != k.state || string(r.Result) != k.result {
				t.Fatalf("%q after maintenance: %+v, want %s with token %d", k.key, r, k.state, k.token)
			}
			c, err := worker.Claim(ctx, req(string(k.key), longLease, longTTL))
			mustOK(t, fmt.Sprintf("Claim(%q) after maintenance", k.key), err)
			if c.Outcome == idem.OutcomeAcquired {
				t.Fatalf("%q, claimed and %s during maintenance, was acquired again (token %d): its effect would run twice", k.key, k.state, c.Record.Token)
			}
		}
	}
}

type maintWorker struct {
	s  *suite
	st idem.Store
	u  time.Duration
	// late counts operations that found a record already expired because
	// the machine was slower than its TTL (not an error, logged).
	late atomic.Int64
}

// pass runs step on every key, one goroutine per worker, pacing the keys so
// that maintenance rounds interleave with them.
func (m *maintWorker) pass(t *testing.T, keys [][]*maintKey, step func(ctx context.Context, k *maintKey, i int) error) {
	var wg sync.WaitGroup
	for _, ks := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := ctxT(t)
			for i, k := range ks {
				if err := step(ctx, k, i); err != nil {
					t.Errorf("%q: %v", k.key, err)
					return
				}
				time.Sleep(m.u / 10)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// claim claims k and checks that it is acquired; it sets the key's token,
// state and retention bounds.
func (m *maintWorker) claim(ctx context.Context, k *maintKey, lease, ttl time.Duration, batch bool) error {
	r := idem.ClaimRequest{Key: k.key, Lease: lease, TTL: ttl}
	before := time.Now()
	var c idem.Claim
	var err error
	if b, ok := m.st.(idem.BatchClaimer); ok && batch {
		var res []idem.BatchResult
		if res, err = b.ClaimBatch(ctx, []idem.ClaimRequest{r}); err == nil {
			if len(res) != 1 {
				return fmt.Errorf("ClaimBatch of one key returned %d results", len(res))
			}
			c, err = res[0].Claim, res[0].Err
		}
	} else {
		c, err = m.st.Claim(ctx, r)
	}
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if c.Outcome != idem.OutcomeAcquired {
		return fmt.Errorf("claim = %s (record %+v), want acquired: the key is new or its record expired", c.Outcome, c.Record)
	}
	k.token, k.state, k.result = c.Record.Token, idem.StateInProgress, ""
	span := max(lease, ttl)
	k.liveUntil, k.goneAfter = before.Add(span), time.Now().Add(span)
	return nil
}

// complete completes k with a result; retention restarts at the claim's TTL.
func (m *maintWorker) complete(ctx context.Context, k *maintKey, ttl time.Duration) error {
	before := time.Now()
	if err := m.st.Complete(ctx, k.key, k.token, k.key); err != nil {
		if errors.Is(err, idem.ErrNotFound) && !time.Now().Before(k.liveUntil) {
			// Its retention may have ended before the Complete applied:
			// the claim's reply, or this call, came later than a short
			// TTL on a slow machine (a SQL claim may wait out
			// maintenance's table lock). The record expired; nothing was
			// removed early. A short key is still claimed again in the
			// second pass; any other is no longer checked.
			m.late.Add(1)
			if k.kind != maintShort {
				k.lost = true
			}
			return nil
		}
		return m.lostLive(k, "Complete", err)
	}
	k.state, k.result = idem.StateCompleted, string(k.key)
	k.liveUntil, k.goneAfter = before.Add(ttl), time.Now().Add(ttl)
	return nil
}

// read checks that k's record is as the worker left it, unless its
// retention may have ended.
func (m *maintWorker) read(ctx context.Context, k *maintKey) error {
	r, err := m.st.Get(ctx, k.key)
	if err != nil {
		if errors.Is(err, idem.ErrNotFound) && !time.Now().Before(k.liveUntil) {
			return nil
		}
		return m.lostLive(k, "Get", err)
	}
	if r.Token != k.token || r.State != k.state || string(r.Result) != k.result {
		return fmt.Errorf("Get = %+v, want %s with token %d", r, k.state, k.token)
	}
	return nil
}

// lostLive words the error of an operation on a record that must still be
// there.
func (m *maintWorker) lostLive(k *maintKey, what string, err error) error {
	if errors.Is(err, idem.ErrNotFound) && time.Now().Before(k.liveUntil) {
		return fmt.Errorf("%s: %w: maintenance removed a live record (%s, token %d, retention not over for %s)", what, err, k.state, k.token, time.Until(k.liveUntil).Round(time.Millisecond))
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (m *maintWorker) first(ctx context.Context, k *maintKey, i int) error {
	short := 2 * m.u
	switch k.kind {
	case maintLong:
		if err := m.claim(ctx, k, longLease, longTTL, i%2 == 0); err != nil {
			return err
		}
		if err := m.complete(ctx, k, longTTL); err != nil {
			return err
		}
	case maintShort:
		if err := m.claim(ctx, k, m.u, short, false); err != nil {
			return err
		}
		if i%2 == 0 {
			if err := m.complete(ctx, k, short); err != nil {
				return err
			}
		}
		// Read it again well within its retention, after maintenance has
		// had time to run: a round that removes records early is seen.
		time.Sleep(m.u / 2)
	case maintExtend:
		if err := m.claim(ctx, k, m.u, m.u, false); err != nil {
			return err
		}
		before := time.Now()
		if err := m.st.Extend(ctx, k.key, k.token, longLease); err != nil {
			if errors.Is(err, idem.ErrNotFound) && !time.Now().Before(k.liveUntil) {
				k.lost = true // this machine was too slow to extend it in time
				m.late.Add(1)
				return nil
			}
			return m.lostLive(k, "Extend", err)
		}
		k.liveUntil, k.goneAfter = before.Add(longLease), time.Now().Add(longLease)
	}
	return m.read(ctx, k)
}

func (m *maintWorker) second(ctx context.Context, k *maintKey, i int) error {
	if k.lost {
		return nil
	}
	switch k.kind {
	case maintLong:
		c, err := m.st.Claim(ctx, req(string(k.key), longLease, longTTL))
		if err != nil {
			return m.lostLive(k, "Claim", err)
		}
		if c.Outcome != idem.OutcomeCompleted || c.Record.Token != k.token {
			return fmt.Errorf("claim of a completed key = %s with token %d, want completed with token %d", c.Outcome, c.Record.Token, k.token)
		}
	case maintShort:
		// Expired (and perhaps removed by maintenance): acquirable again.
		if err := m.claim(ctx, k, longLease, longTTL, i%2 == 1); err != nil {
			return err
		}
		if err := m.complete(ctx, k, longTTL); err != nil {
			return err
		}
	case maintExtend:
		before := time.Now()
		if err := m.st.Extend(ctx, k.key, k.token, longLease); err != nil {
			return m.lostLive(k, "Extend", err)
		}
		k.liveUntil = before.Add(longLease)
	}
	return m.read(ctx, k)
}
