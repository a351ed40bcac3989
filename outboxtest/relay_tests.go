package outboxtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/outbox"
)

// Quiet is a logger that drops everything, for relays in tests.
func Quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newRelay(t testing.TB, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = Quiet()
	}
	r, err := outbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// StartRelay runs r until the test ends (or the returned stop is called,
// which waits for Run to return).
func StartRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (s *suite) waitSent(t testing.TB, rec *Recorder, all []string) {
	t.Helper()
	WaitFor(t, "every message published", s.feat.Timeout, func() (bool, string) {
		missing := 0
		for _, id := range all {
			if rec.Count(id) == 0 {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d missing", missing, len(all))
	})
}

func (s *suite) waitDrained(t testing.TB, h Harness) {
	t.Helper()
	WaitFor(t, "the outbox to drain", s.feat.Timeout, func() (bool, string) {
		st, err := h.Backend.Stats(context.Background())
		return err == nil && st.Pending == 0, fmt.Sprintf("%+v %v", st, err)
	})
}

func exactlyOnce(t testing.TB, rec *Recorder, all []string) {
	t.Helper()
	for _, id := range all {
		if n := rec.Count(id); n != 1 {
			t.Fatalf("message %s published %d times, want once", id, n)
		}
	}
	if rec.Distinct() != len(all) {
		t.Fatalf("%d distinct messages published, want %d", rec.Distinct(), len(all))
	}
}

// testRelayEachOnce: a running relay publishes every committed message
// once, with its ID (the broker's dedup id), topic, key, headers and
// payload, and marks it sent.
func (s *suite) testRelayEachOnce(t *testing.T) {
	h := s.harness(t)
	rec := NewRecorder()
	stop := StartRelay(t, newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec, BatchSize: 50, PollInterval: 20 * time.Millisecond}))
	var all []string
	want := map[string]outbox.Message{}
	for i := 0; i < s.feat.Messages; i += 20 {
		batch := msgs(20)
		for j := range batch {
			batch[j].Headers = map[string]string{"n": fmt.Sprint(i + j)}
		}
		got := enqueue(t, h, true, batch...)
		for j, id := range got {
			want[id] = batch[j]
		}
		all = append(all, got...)
	}
	s.waitSent(t, rec, all)
	s.waitDrained(t, h)
	stop()
	exactlyOnce(t, rec, all)
	for _, m := range rec.Published() {
		w := want[m.ID]
		if m.Topic != w.Topic || string(m.Key) != string(w.Key) || string(m.Payload) != string(w.Payload) || !maps.Equal(m.Headers, w.Headers) {
			t.Fatalf("published %+v, enqueued %+v", m, w)
		}
	}
}

// testSeveralRelays: several relays (each with two claim loops) run while
// producers commit: every message is published exactly once, none is
// skipped, and the outbox drains.
func (s *suite) testSeveralRelays(t *testing.T) {
	h := s.harness(t)
	rec := NewRecorder()
	var stops []func()
	for range s.feat.Relays {
		r := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec, BatchSize: 16, Concurrency: 2, PollInterval: 5 * time.Millisecond})
		stops = append(stops, StartRelay(t, r))
	}
	var mu sync.Mutex
	var all []string
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := p; i < s.feat.Messages; i += 4 * 5 {
				got := enqueue(t, h, true, msgs(5)...)
				mu.Lock()
				all = append(all, got...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.waitSent(t, rec, all)
	s.waitDrained(t, h)
	for _, stop := range stops {
		stop()
	}
	exactlyOnce(t, rec, all)
}

// testCrashAfterPublish: a relay publishes a batch and dies before marking
// it sent. The rows come back and the next relay publishes them again (the
// only case of a second publish: the broker's dedup or the consumer's
// guard absorbs it); every other message is published once.
func (s *suite) testCrashAfterPublish(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(10)...)
	rec := NewRecorder()
	b := claim(t, h, outbox.ClaimRequest{Limit: 4, Now: later()})
	var out []*broker.Message
	for _, r := range b.Rows() {
		out = append(out, &broker.Message{ID: r.ID, Topic: r.Topic, Key: r.Key, Headers: r.Headers, Payload: r.Payload})
	}
	if err := rec.Publish(ctxT(t), out...); err != nil {
		t.Fatal(err)
	}
	h.Crash(b) // after publish, before mark-sent
	crashed := ids(b.Rows())
	stop := StartRelay(t, newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec, PollInterval: 10 * time.Millisecond}))
	s.waitDrained(t, h)
	stop()
	for _, id := range all {
		want := 1
		if slices.Contains(crashed, id) {
			want = 2
		}
		if n := rec.Count(id); n != want {
			t.Fatalf("message %s published %d times, want %d (crashed batch %v)", id, n, want, crashed)
		}
	}
}

// testShutdownAfterPublish: the relay is shut down (its context
// cancelled) just after the broker took its batch: the rows are still
// marked sent, not left to be published again. The claim's context bounds
// the claim, not the life of its batch (database/sql rolls a transaction
// back when the context given to BeginTx ends).
func (s *suite) testShutdownAfterPublish(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(5)...)
	rec := NewRecorder()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	rec.After(func([]*broker.Message) { cancel() })
	relay := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec})
	if n, err := relay.RunOnce(ctx); n != len(all) || err != nil {
		t.Fatalf("RunOnce = %d, %v; want %d rows settled", n, err, len(all))
	}
	st, err := h.Backend.Stats(ctxT(t))
	if err != nil || st.Pending != 0 {
		t.Fatalf("stats %+v, %v: the published batch was not marked sent", st, err)
	}
}

// testShutdownMidFallback: a batch's publish failed and the relay is
// publishing its messages one by one when it is shut down: the ones the
// broker took are marked sent (not left to be published again), the
// others are freed unchanged (no attempt counted).
func (s *suite) testShutdownMidFallback(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(3)...)
	rec := NewRecorder()
	rec.Refuse(all[2], fmt.Errorf("refused")) // fails the batch
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	rec.After(func([]*broker.Message) { cancel() }) // after the first single publish
	relay := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec})
	if n, err := relay.RunOnce(ctx); n != len(all) || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	if rec.Count(all[0]) != 1 || rec.Total() != 1 {
		t.Fatalf("published %d messages (%s: %d), want %s alone", rec.Total(), all[0], rec.Count(all[0]), all[0])
	}
	rows := claim(t, h, outbox.ClaimRequest{Now: later()}).Rows()
	wantIDs(t, "left pending", ids(rows), all[1:])
	for _, r := range rows {
		if r.Attempts != 0 {
			t.Fatalf("a row not tried before the shutdown counts an attempt: %+v", r)
		}
	}
}

// frozenPublisher stands for a relay that stopped mid-publish without its
// connection closing (its host lost power, a network partition, a process
// frozen): Publish blocks, whatever its context says, until thawed.
type frozenPublisher struct {
	entered chan struct{}
	thaw    chan struct{}
}

func (p frozenPublisher) Publish(context.Context, ...*broker.Message) error {
	close(p.entered)
	<-p.thaw
	return nil
}
func (frozenPublisher) Close() error { return nil }

// testFrozenRelay: a relay that stops between its claim and its
// settlement with its connection still open holds the claim's rows for as
// long as the server keeps the session: with nothing sent on it, until
// TCP keepalive gives up (over two hours on Linux's defaults), or for ever
// for a process that is frozen, not dead. With HoldEnds the backend ends
// the claim once it stayed silent past its Hold (the relay's: from
// PublishTimeout), another relay takes the rows, unchanged, and the
// thawed relay's settlement fails.
func (s *suite) testFrozenRelay(t *testing.T) {
	if !s.feat.HoldEnds {
		t.Skip("the backend does not end claims held past their Hold")
	}
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(1)...)
	ctx := ctxT(t)
	pub := frozenPublisher{entered: make(chan struct{}), thaw: make(chan struct{})}
	relay := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: pub, PublishTimeout: 200 * time.Millisecond})
	done := make(chan error, 1)
	go func() { _, err := relay.RunOnce(ctx); done <- err }()
	// thaw lets the relay go on and returns what RunOnce did; deferred
	// too, so that a failing test ends the relay before the cleanups.
	thaw := sync.OnceValue(func() error { close(pub.thaw); return <-done })
	defer thaw()
	<-pub.entered
	var rows []outbox.Row
	WaitFor(t, "another claim to get the frozen relay's rows", 30*time.Second, func() (bool, string) {
		b, err := h.Backend.Claim(ctx, outbox.ClaimRequest{Limit: 10, Now: later()})
		if err != nil {
			return false, err.Error()
		}
		rows = b.Rows()
		_ = b.Release(ctx)
		return len(rows) == 1, "still held"
	})
	if thaw() == nil {
		t.Fatal("the thawed relay settled a claim the backend had ended")
	}
	if rows[0].ID != all[0] || rows[0].Attempts != 0 {
		t.Fatalf("rows %+v", rows)
	}
}

// testBackoffSchedule: on an injected clock the attempts of a failing
// message come at the seed's schedule (1s, then 1.5s, with the jitter the
// relay drew), the third failure marks it failed, and nothing is tried
// after that however long the clock runs.
func (s *suite) testBackoffSchedule(t *testing.T) {
	h := s.harness(t)
	enqueue(t, h, true, msgs(1)...)
	rec := NewRecorder()
	rec.SetDown(true)
	clk := NewClock(later())
	t0 := clk.Now()
	var mu sync.Mutex
	var attempts []time.Time
	var retries []outbox.RetryEvent
	var failed []outbox.FailedEvent
	relay := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec, Clock: clk, Rand: func() float64 { return 0.5 },
		Hooks: outbox.Hooks{
			OnRetry:  func(_ context.Context, e outbox.RetryEvent) { mu.Lock(); retries = append(retries, e); mu.Unlock() },
			OnFailed: func(_ context.Context, e outbox.FailedEvent) { mu.Lock(); failed = append(failed, e); mu.Unlock() },
		}})
	ctx := ctxT(t)
	step := 50 * time.Millisecond
	for clk.Now().Sub(t0) < 30*time.Second {
		calls := rec.Calls()
		if _, err := relay.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if rec.Calls() > calls {
			attempts = append(attempts, clk.Now())
		}
		clk.Advance(step)
	}
	// Delay(n) = min(10s, 1s * 1.5^(n-1)) * (1 + 0.1*0.5).
	want := []time.Duration{1050 * time.Millisecond, 1575 * time.Millisecond}
	if len(attempts) != 3 {
		t.Fatalf("%d attempts at %v, want 3", len(attempts), attempts)
	}
	for i, w := range want {
		gap := attempts[i+1].Sub(attempts[i])
		if gap < w || gap >= w+step {
			t.Fatalf("attempt %d came %s after attempt %d, want %s (within one %s step)", i+2, gap, i+1, w, step)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(retries) != 2 || retries[0].Delay != want[0] || retries[1].Delay != want[1] || retries[1].Row.Attempts != 2 {
		t.Fatalf("retry events %+v", retries)
	}
	if len(failed) != 1 || failed[0].Row.Attempts != 3 || failed[0].Err == nil {
		t.Fatalf("failed events %+v, want one after attempt 3", failed)
	}
	rows, err := h.Backend.ListFailed(ctx, 0, 10)
	if err != nil || len(rows) != 1 || rows[0].Attempts != 3 || rows[0].LastError == "" {
		t.Fatalf("failed rows %+v, %v", rows, err)
	}
}

// testFailedHook: the default relay (3 attempts) marks a message the
// broker keeps refusing failed, calls OnFailed once with it, and goes on
// publishing the others.
func (s *suite) testFailedHook(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(5)...)
	rec := NewRecorder()
	rec.Refuse(all[2], fmt.Errorf("poison"))
	var failed atomic.Int64
	var failedID atomic.Value
	stop := StartRelay(t, newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec, PollInterval: 5 * time.Millisecond,
		Backoff: outbox.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		Hooks: outbox.Hooks{OnFailed: func(_ context.Context, e outbox.FailedEvent) {
			failed.Add(1)
			failedID.Store(e.Row.ID)
		}}}))
	s.waitDrained(t, h)
	stop()
	if failed.Load() != 1 || failedID.Load() != all[2] {
		t.Fatalf("OnFailed called %d times (last %v), want once for %s", failed.Load(), failedID.Load(), all[2])
	}
	for i, id := range all {
		if want := 1; i != 2 && rec.Count(id) != want {
			t.Fatalf("message %s published %d times", id, rec.Count(id))
		}
	}
	st, err := h.Backend.Stats(ctxT(t))
	if err != nil || st.Failed != 1 {
		t.Fatalf("stats %+v, %v; want 1 failed", st, err)
	}
}

// testOneBadMessage: when a batch's publish fails because of one message,
// the others are published one by one in the same round and cost no
// attempt.
func (s *suite) testOneBadMessage(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(6)...)
	rec := NewRecorder()
	rec.Refuse(all[3], fmt.Errorf("too large"))
	relay := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec})
	if n, err := relay.RunOnce(ctxT(t)); n != 6 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	for i, id := range all {
		want := 1
		if i == 3 {
			want = 0
		}
		if rec.Count(id) != want {
			t.Fatalf("message %d published %d times, want %d", i, rec.Count(id), want)
		}
	}
	st, _ := h.Backend.Stats(ctxT(t))
	if st.Pending != 1 {
		t.Fatalf("stats %+v: want the bad message pending (rescheduled)", st)
	}
}

// testMalformedRow: a stored row that cannot be read as a message (its
// headers do not decode) stops nothing: the claim returns it with Row.Bad
// set, and the relay marks it failed at once (no attempt can mend it),
// raising OnFailed, while the rows around it are published. A claim that
// failed on it would stop every relay of the outbox for ever, with only
// OnError("claim") to say so.
func (s *suite) testMalformedRow(t *testing.T) {
	h := s.harness(t)
	if h.BreakHeaders == nil {
		t.Skip("the harness cannot damage a stored row")
	}
	all := enqueue(t, h, true, msgs(3)...)
	h.BreakHeaders(t, all[1])
	rec := NewRecorder()
	var failed []outbox.FailedEvent
	relay := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec,
		Hooks: outbox.Hooks{OnFailed: func(_ context.Context, e outbox.FailedEvent) { failed = append(failed, e) }}})
	if n, err := relay.RunOnce(ctxT(t)); n != 3 || err != nil {
		t.Fatalf("RunOnce = %d, %v; want the 3 rows claimed", n, err)
	}
	if rec.Count(all[0]) != 1 || rec.Count(all[1]) != 0 || rec.Count(all[2]) != 1 {
		t.Fatalf("published %d, %d, %d times; want the good rows once, the malformed one never", rec.Count(all[0]), rec.Count(all[1]), rec.Count(all[2]))
	}
	if len(failed) != 1 || failed[0].Row.ID != all[1] || failed[0].Row.Attempts != 1 {
		t.Fatalf("OnFailed events %+v, want one for %s after its first attempt", failed, all[1])
	}
	rows, err := h.Backend.ListFailed(ctxT(t), 0, 10)
	if err != nil || len(rows) != 1 || rows[0].ID != all[1] || rows[0].LastError == "" || rows[0].Bad == "" {
		t.Fatalf("failed rows %+v, %v; want %s, with its error and Bad", rows, err, all[1])
	}
}

// testBrokerOutage: the broker is down for longer than the whole backoff.
// When its error says it is unreachable (idem.ErrUnavailable) the rounds
// are an outage: with the default attempts, as with Unlimited, no message
// fails and all are published by themselves once it is back. When its
// error says nothing the relay can classify, the default attempts are used
// up: every message ends failed (each reported to OnFailed), none is lost:
// re-queued after the outage, all are published, once each.
func (s *suite) testBrokerOutage(t *testing.T) {
	unavailable := fmt.Errorf("%w: outboxtest: broker unreachable", idem.ErrUnavailable)
	for _, tc := range []struct {
		name        string
		maxAttempts int
		err         error
	}{{"MaxAttempts3", 0, ErrBrokerDown}, {"Unlimited", outbox.Unlimited, ErrBrokerDown},
		{"MaxAttempts3Unavailable", 0, unavailable}} {
		t.Run(tc.name, func(t *testing.T) {
			h := s.harness(t)
			rec := NewRecorder()
			rec.SetDownWith(tc.err)
			outage := tc.maxAttempts == outbox.Unlimited || tc.err != ErrBrokerDown
			var failed atomic.Int64
			stop := StartRelay(t, newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec, BatchSize: 20, MaxAttempts: tc.maxAttempts,
				PollInterval: 5 * time.Millisecond, Backoff: outbox.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
				Hooks: outbox.Hooks{OnFailed: func(context.Context, outbox.FailedEvent) { failed.Add(1) }}}))
			var all []string
			for range 5 {
				all = append(all, enqueue(t, h, true, msgs(10)...)...)
			}
			if !outage {
				WaitFor(t, "every message to fail and be reported", s.feat.Timeout, func() (bool, string) {
					st, err := h.Backend.Stats(context.Background())
					return err == nil && st.Failed == int64(len(all)) && failed.Load() == int64(len(all)),
						fmt.Sprintf("%+v %v, %d reported", st, err, failed.Load())
				})
			} else {
				WaitFor(t, "attempts well past the backoff", s.feat.Timeout, func() (bool, string) {
					return rec.Calls() > 3*len(all), fmt.Sprintf("%d publish calls", rec.Calls())
				})
			}
			if rec.Total() != 0 {
				t.Fatalf("%d messages published while the broker was down", rec.Total())
			}
			if outage {
				if st, err := h.Backend.Stats(context.Background()); err != nil || st.Failed != 0 || failed.Load() != 0 {
					t.Fatalf("an outage failed messages: %+v, %v, %d reported", st, err, failed.Load())
				}
			}
			rec.SetDown(false)
			if !outage {
				if n, err := outbox.RequeueFailed(ctxT(t), h.Backend, 7); err != nil || n != len(all) {
					t.Fatalf("RequeueFailed = %d, %v; want %d", n, err, len(all))
				}
			}
			s.waitSent(t, rec, all)
			s.waitDrained(t, h)
			stop()
			exactlyOnce(t, rec, all)
		})
	}
}

// testOrderedRelay: with Ordered, each key's messages are published in
// enqueue order even with several relays and a broker that fails now and
// then.
func (s *suite) testOrderedRelay(t *testing.T) {
	h := s.harness(t)
	rec := NewRecorder()
	var n atomic.Int64
	flaky := &flakyPublisher{inner: rec, every: 3, n: &n}
	var stops []func()
	for range 2 {
		stops = append(stops, StartRelay(t, newRelay(t, outbox.Config{Backend: h.Backend, Publisher: flaky, Ordered: true, BatchSize: 8, Concurrency: 2,
			MaxAttempts: outbox.Unlimited, PollInterval: 5 * time.Millisecond, Backoff: outbox.Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond}})))
	}
	const keys, per = 5, 12
	var all []string
	order := map[string][]string{}
	for i := range per {
		var batch []outbox.Message
		for k := range keys {
			batch = append(batch, outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "key-%d", k), Payload: fmt.Appendf(nil, "%d", i)})
		}
		got := enqueue(t, h, true, batch...)
		for k, id := range got {
			key := fmt.Sprintf("key-%d", k)
			order[key] = append(order[key], id)
		}
		all = append(all, got...)
	}
	s.waitSent(t, rec, all)
	s.waitDrained(t, h)
	for _, stop := range stops {
		stop()
	}
	got := map[string][]string{}
	for _, m := range rec.Published() {
		got[string(m.Key)] = append(got[string(m.Key)], m.ID)
	}
	for key, want := range order {
		if !slices.Equal(got[key], want) {
			t.Fatalf("key %s published as %v, enqueued as %v", key, got[key], want)
		}
	}
}

// flakyPublisher fails every every-th Publish call.
type flakyPublisher struct {
	inner broker.Publisher
	every int64
	n     *atomic.Int64
}

func (p *flakyPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if p.n.Add(1)%p.every == 0 {
		return fmt.Errorf("flaky broker")
	}
	return p.inner.Publish(ctx, msgs...)
}

func (p *flakyPublisher) Close() error { return nil }

// testStatsHook: OnStats reports the backlog, the oldest unsent age and the
// failed count.
func (s *suite) testStatsHook(t *testing.T) {
	h := s.harness(t)
	enqueue(t, h, true, msgs(7)...)
	rec := NewRecorder()
	rec.SetDown(true)
	got := make(chan outbox.Stats, 100)
	stop := StartRelay(t, newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec, StatsInterval: 10 * time.Millisecond,
		Backoff: outbox.Backoff{Initial: time.Hour, Max: time.Hour},
		Hooks:   outbox.Hooks{OnStats: func(_ context.Context, s outbox.Stats) { got <- s }}}))
	var st outbox.Stats
	WaitFor(t, "a stats report with the backlog", s.feat.Timeout, func() (bool, string) {
		for {
			select {
			case st = <-got:
				if st.Pending == 7 {
					return true, ""
				}
			default:
				return false, fmt.Sprintf("%+v", st)
			}
		}
	})
	stop()
	if st.OldestPending.IsZero() || st.OldestAge() < 0 || st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
}
