package promidem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeStater struct {
	calls atomic.Int32
	err   atomic.Pointer[error]
	block bool
	st    idem.Stats
}

func (s *fakeStater) Stats(ctx context.Context) (idem.Stats, error) {
	s.calls.Add(1)
	if s.block {
		<-ctx.Done()
		return idem.Stats{}, ctx.Err()
	}
	if e := s.err.Load(); e != nil {
		return idem.Stats{}, *e
	}
	return s.st, nil
}

type fakeLag struct{ n int64 }

func (l *fakeLag) Lag(context.Context) (int64, error) { return l.n, nil }

type fakeConsumer struct{ st consumer.Stats }

func (c fakeConsumer) Stats() consumer.Stats { return c.st }

// TestStorePollCachedAndErrors: record counts are polled once per
// PollInterval however often Prometheus scrapes (a SQL store counts with
// a scan); a failed poll leaves idem_records out of the scrape instead of
// showing zeros, and counts one poll error.
func TestStorePollCachedAndErrors(t *testing.T) {
	col, reg := newCollector(t, promidem.Config{PollInterval: time.Hour})
	s := &fakeStater{st: idem.Stats{InProgress: 1, Completed: 20, Failed: 3, Released: 4}}
	col.WatchStore(s)
	for range 3 {
		want(t, scrape(t, reg), map[string]float64{
			`idem_records{state="in_progress"}`: 1, `idem_records{state="completed"}`: 20,
			`idem_records{state="failed"}`: 3, `idem_records{state="released"}`: 4,
		})
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("3 scrapes within PollInterval polled %d times, want 1", n)
	}

	bad := &fakeStater{}
	e := fmt.Errorf("%w: down", idem.ErrUnavailable)
	bad.err.Store(&e)
	col.WatchStore(bad) // a new source polls at the next scrape
	for range 2 {
		got := scrape(t, reg)
		if _, ok := got[`idem_records{state="completed"}`]; ok {
			t.Fatal("idem_records shown although a store's poll failed")
		}
		want(t, got, map[string]float64{`idem_poll_errors_total{source="store"}`: 1})
	}
}

// TestPollTimeout: a store that does not answer is given up after
// PollTimeout, so a scrape is not stuck on it; with a negative
// PollInterval every scrape polls again.
func TestPollTimeout(t *testing.T) {
	col, reg := newCollector(t, promidem.Config{PollInterval: -1, PollTimeout: 10 * time.Millisecond})
	s := &fakeStater{block: true}
	col.WatchStore(s)
	scrape(t, reg)
	scrape(t, reg)
	want(t, scrape(t, reg), map[string]float64{`idem_poll_errors_total{source="store"}`: 3})
	if n := s.calls.Load(); n != 3 {
		t.Fatalf("polls = %d, want one per scrape", n)
	}
}

// watchAll gives col a source of every kind, so that every metric
// family is exported.
func watchAll(col *promidem.Collector) {
	col.GuardHooks()
	col.ConsumerHooks()
	col.WatchStore(&fakeStater{st: idem.Stats{Completed: 1}})
	col.WatchConsumer(fakeConsumer{consumer.Stats{InFlight: 2, HeldNow: 1, SettleErrors: 5, Lost: 3}})
	col.WatchLag(&fakeLag{n: 7})
	col.OutboxHooks().OnStats(context.Background(), outboxStats())
}

// TestLintAndNoKeyLabels: the exposition passes promlint (names, units,
// _total, help), and claiming a thousand distinct keys adds no series: no
// key ever becomes a label.
func TestLintAndNoKeyLabels(t *testing.T) {
	ctx := context.Background()
	col, reg := newCollector(t, promidem.Config{Namespace: "orders"})
	watchAll(col)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	before := len(scrape(t, reg))
	ms, err := memstore.New(memstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idem.NewGuard(ms, idem.WithHooks(col.GuardHooks()), idem.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range 1000 {
		key := []byte(fmt.Sprintf("order-%d", i))
		_, _ = g.Do(ctx, key, nop)
		_, _ = g.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, errors.New("never runs") })
	}
	got := scrape(t, reg)
	if len(got) != before {
		t.Fatalf("series: %d before 1000 keys, %d after", before, len(got))
	}
	want(t, got, map[string]float64{`idem_claims_total{idem_namespace="orders",outcome="completed"}`: 1000})
}

// TestOnlyPluggedSourcesExported: a collector that only counts records
// (as idem serve uses it) exports idem_records and its poll errors, no
// zero series of guards, consumers or relays it is not plugged into; the
// guard's families appear once its hooks are taken.
func TestOnlyPluggedSourcesExported(t *testing.T) {
	col, reg := newCollector(t, promidem.Config{})
	col.WatchStore(&fakeStater{st: idem.Stats{Completed: 2}})
	names := func() []string {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, mf := range mfs {
			out = append(out, mf.GetName())
		}
		return out
	}
	if got := fmt.Sprint(names()); got != "[idem_poll_errors_total idem_records]" {
		t.Fatalf("families %s", got)
	}
	col.GuardHooks()
	if got := names(); !slices.Contains(got, "idem_claims_total") || slices.Contains(got, "idem_consumer_acks_total") {
		t.Fatalf("after GuardHooks: %v", got)
	}
}
