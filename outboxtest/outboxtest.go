package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/outbox"
)

// Tx is a business transaction on the outbox's database, in which messages
// are enqueued.
type Tx interface {
	Enqueue(ctx context.Context, msgs ...outbox.Message) ([]string, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Harness is one fresh, empty outbox.
type Harness struct {
	// Backend is the outbox under test. It must be configured with a
	// NewID that makes unique ids (a snowflake generator, a counter).
	Backend outbox.Backend
	// Begin starts a business transaction on the same database.
	Begin func(ctx context.Context) (Tx, error)
	// Crash ends b as if the process holding it had died after
	// publishing (SQL: its connection closed without a commit). Nil: the
	// suite calls b.Release, which a crash must be equivalent to.
	Crash func(b outbox.Batch)
	// BreakHeaders overwrites the stored headers of the committed row id
	// with bytes that do not decode, as another program writing the table
	// (or damage) could. Nil: the suite skips MalformedRowFailsAlone.
	BreakHeaders func(t testing.TB, id string)
}

// Factory makes a fresh, empty outbox for t and registers its cleanup.
type Factory func(t testing.TB) Harness

// Features says what the backend can do.
type Features struct {
	// ConcurrentTx: two business transactions can be open at once (false
	// for bbolt, whose writers take turns), so the suite can commit them
	// out of Seq order.
	ConcurrentTx bool
	// HoldEnds: the backend ends a claim left silent for longer than its
	// ClaimRequest.Hold, freeing its rows although the claimer's
	// connection stays open (pgoutbox, mysqloutbox), so the suite checks
	// it with a frozen relay.
	HoldEnds bool
	// Relays run at once in the contention tests (default 4).
	Relays int
	// Messages in the relay tests (default 400).
	Messages int
	// Timeout bounds each wait for a condition (default 60s): it only
	// stops a broken backend's test from hanging.
	Timeout time.Duration
}

func (f *Features) defaults() {
	if f.Relays <= 0 {
		f.Relays = 4
	}
	if f.Messages <= 0 {
		f.Messages = 400
	}
	if f.Timeout <= 0 {
		f.Timeout = 60 * time.Second
	}
}

type suite struct {
	f    Factory
	feat Features
}

// Run runs the whole suite as subtests of t.
func Run(t *testing.T, f Factory, feat Features) {
	feat.defaults()
	s := &suite{f: f, feat: feat}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"EnqueueClaimRoundTrip", s.testRoundTrip},
		{"GeneratedIDAndTrace", s.testGeneratedID},
		{"InvalidBeforeIO", s.testInvalid},
		{"LargeEnqueue", s.testLargeEnqueue},
		{"DuplicateID", s.testDuplicateID},
		{"RolledBackPublishesNothing", s.testRollback},
		{"ClaimOrderLimitSkipLocked", s.testClaimSkipLocked},
		{"OutOfOrderCommitNoCursor", s.testOutOfOrderCommit},
		{"Settle", s.testSettle},
		{"SettleInvalid", s.testSettleInvalid},
		{"SettleAnyErrorText", s.testSettleErrorText},
		{"CrashFreesRows", s.testCrashFreesRows},
		{"ListFailedRequeue", s.testListRequeue},
		{"PurgeSent", s.testPurge},
		{"Stats", s.testStats},
		{"Ordered", s.testOrdered},
		{"ContextCancelled", s.testContextCancelled},
		{"RelayPublishesEachOnce", s.testRelayEachOnce},
		{"SeveralRelays", s.testSeveralRelays},
		{"CrashAfterPublish", s.testCrashAfterPublish},
		{"ShutdownAfterPublish", s.testShutdownAfterPublish},
		{"ShutdownMidFallback", s.testShutdownMidFallback},
		{"FrozenRelayFreesItsRows", s.testFrozenRelay},
		{"BackoffSchedule", s.testBackoffSchedule},
		{"FailedAfterMaxAttempts", s.testFailedHook},
		{"OneBadMessage", s.testOneBadMessage},
		{"MalformedRowFailsAlone", s.testMalformedRow},
		{"BrokerOutage", s.testBrokerOutage},
		{"OrderedRelay", s.testOrderedRelay},
		{"StatsHook", s.testStatsHook},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

// NewID returns a unique message id generator for harnesses: "m-<random>-<n>".
func NewID() func() (string, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "m-" + hex.EncodeToString(b[:]) + "-"
	var mu sync.Mutex
	n := 0
	return func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		return fmt.Sprintf("%s%d", prefix, n), nil
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Clock is a settable clock for the backoff tests.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// Recorder is a broker.Publisher that keeps what it was given. A batch is
// all or nothing: when the broker is down, or a message of the batch is
// refused, Publish records none of it and returns an error.
type Recorder struct {
	mu     sync.Mutex
	msgs   []*broker.Message
	count  map[string]int
	down   error
	refuse map[string]error
	after  func(msgs []*broker.Message) // after a successful publish
	calls  int
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{count: map[string]int{}, refuse: map[string]error{}} }

// ErrBrokerDown is what a Recorder set down returns.
var ErrBrokerDown = errors.New("outboxtest: broker down")

// SetDown makes every Publish fail (true) or succeed again (false).
func (r *Recorder) SetDown(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = nil
	if down {
		r.down = ErrBrokerDown
	}
}

// SetDownWith makes every Publish fail with err (nil: succeed again), e.g.
// an error wrapping idem.ErrUnavailable as a broker adapter returns when
// it cannot reach its broker.
func (r *Recorder) SetDownWith(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = err
}

// Refuse makes every Publish holding id fail with err (nil: accept again).
func (r *Recorder) Refuse(id string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.refuse, id)
	} else {
		r.refuse[id] = err
	}
}

// After sets a function called (outside the lock) after each successful
// Publish with its messages.
func (r *Recorder) After(f func(msgs []*broker.Message)) { r.mu.Lock(); r.after = f; r.mu.Unlock() }

// Publish implements broker.Publisher.
func (r *Recorder) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	r.calls++
	if down := r.down; down != nil {
		r.mu.Unlock()
		return down
	}
	for _, m := range msgs {
		if err := r.refuse[m.ID]; err != nil {
			r.mu.Unlock()
			return fmt.Errorf("message %s: %w", m.ID, err)
		}
	}
	for _, m := range msgs {
		c := *m
		r.msgs = append(r.msgs, &c)
		r.count[m.ID]++
	}
	after := r.after
	r.mu.Unlock()
	if after != nil {
		after(msgs)
	}
	return nil
}

// Close implements broker.Publisher.
func (r *Recorder) Close() error { return nil }

// Count is how many times id was published.
func (r *Recorder) Count(id string) int { r.mu.Lock(); defer r.mu.Unlock(); return r.count[id] }

// Distinct is how many different ids were published.
func (r *Recorder) Distinct() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.count) }

// Total is how many messages were published, duplicates included.
func (r *Recorder) Total() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.msgs) }

// Calls is how many times Publish was called.
func (r *Recorder) Calls() int { r.mu.Lock(); defer r.mu.Unlock(); return r.calls }

// Published returns a copy of every published message in order.
func (r *Recorder) Published() []*broker.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*broker.Message(nil), r.msgs...)
}

// WaitFor polls cond every 10ms until it holds, failing t after timeout
// (a bound on a hung test, not a timing assertion).
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (%s)", timeout, what, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
