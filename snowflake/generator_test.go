package snowflake_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/snowflake"
)

// scriptClock returns the times of script in turn, then keeps advancing
// by step from the last one on every read.
type scriptClock struct {
	mu     sync.Mutex
	script []time.Time
	t      time.Time
	step   time.Duration
	reads  int
}

func (c *scriptClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	if len(c.script) > 0 {
		c.t, c.script = c.script[0], c.script[1:]
		return c.t
	}
	c.t = c.t.Add(c.step)
	return c.t
}

func (c *scriptClock) set(t time.Time, step time.Duration, script ...time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t, c.step, c.script = t, step, script
}

func newGen(t testing.TB, cfg snowflake.Config) *snowflake.Generator {
	t.Helper()
	g, err := snowflake.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func next(t testing.TB, g *snowflake.Generator) snowflake.ID {
	t.Helper()
	id, err := g.Next()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestNextMonotonic: property: one goroutine's ids strictly increase, carry
// the worker id, and their time lies between the clock readings around
// the call.
func TestNextMonotonic(t *testing.T) {
	g := newGen(t, snowflake.Config{Worker: 77})
	l := g.Layout()
	prev := snowflake.ID(-1)
	for i := 0; i < 200000; i++ {
		before := time.Now().Truncate(time.Millisecond)
		id := next(t, g)
		after := time.Now()
		if id <= prev {
			t.Fatalf("id %d after %d", id, prev)
		}
		prev = id
		p, _ := l.Parse(id)
		if p.Worker != 77 || p.Time.Before(before) || p.Time.After(after) {
			t.Fatalf("id %d = %+v; made between %v and %v by worker 77", id, p, before, after)
		}
	}
}

// TestNextUniqueAcrossGoroutines: property: ids taken by many goroutines
// at once are all distinct, and each goroutine sees them increase.
func TestNextUniqueAcrossGoroutines(t *testing.T) {
	g := newGen(t, snowflake.Config{Worker: 3})
	const workers, each = 8, 40000
	out := make([][]snowflake.ID, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]snowflake.ID, each)
			for i := range ids {
				id, err := g.Next()
				if err != nil {
					t.Error(err)
					return
				}
				if i > 0 && id <= ids[i-1] {
					t.Errorf("goroutine %d: id %d after %d", w, id, ids[i-1])
					return
				}
				ids[i] = id
			}
			out[w] = ids
		}()
	}
	wg.Wait()
	seen := make(map[snowflake.ID]bool, workers*each)
	for _, ids := range out {
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("duplicate id %d", id)
			}
			seen[id] = true
		}
	}
}

// TestSequenceExhaustedWaits: with 2 ids per millisecond and a clock that
// moves 100µs per read, the third id of a millisecond waits for the next:
// no millisecond holds more than 2 ids, and none repeats.
func TestSequenceExhaustedWaits(t *testing.T) {
	clk := &scriptClock{}
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	clk.set(base, 100*time.Microsecond)
	l := snowflake.Layout{TimeBits: 52, WorkerBits: 10, SequenceBits: 1}
	g := newGen(t, snowflake.Config{Layout: l, Clock: clk})
	perMs := map[time.Time]int{}
	prev := snowflake.ID(-1)
	for range 100 {
		id := next(t, g)
		if id <= prev {
			t.Fatalf("id %d after %d", id, prev)
		}
		prev = id
		p, _ := l.Parse(id)
		perMs[p.Time]++
		if perMs[p.Time] > 2 {
			t.Fatalf("%d ids in millisecond %v", perMs[p.Time], p.Time)
		}
	}
	if len(perMs) < 50 {
		t.Fatalf("100 ids over %d milliseconds; want >= 50", len(perMs))
	}
}

// TestClockBackwards: a step back within MaxBackwards is waited out (the
// next id is later than every earlier one); a larger step is refused with
// ErrClockBackwards until the clock passes the last millisecond used, and
// the hook sees both.
func TestClockBackwards(t *testing.T) {
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	type hookCall struct {
		back   time.Duration
		waited bool
	}
	var mu sync.Mutex
	var calls []hookCall
	clk := &scriptClock{}
	clk.set(base, 0)
	g := newGen(t, snowflake.Config{Worker: 1, Clock: clk, MaxBackwards: 50 * time.Millisecond, Hooks: snowflake.Hooks{
		OnClockBackwards: func(back time.Duration, waited bool) {
			mu.Lock()
			calls = append(calls, hookCall{back, waited})
			mu.Unlock()
		},
	}})
	first := next(t, g) // at base

	// 30ms back, then the clock runs 1ms per read: waited out.
	clk.set(base.Add(-31*time.Millisecond), time.Millisecond, base.Add(-30*time.Millisecond))
	second := next(t, g)
	if second <= first {
		t.Fatalf("after a small step back: id %d <= %d", second, first)
	}
	p, _ := g.Layout().Parse(second)
	if p.Time.Before(base) {
		t.Fatalf("id made at %v, before the last millisecond used %v", p.Time, base)
	}

	// 2s back and the clock stands still: refused, no id.
	lastMs := p.Time
	clk.set(lastMs.Add(-2*time.Second), 0)
	_, err := g.Next()
	var cbe *snowflake.ClockBackwardsError
	if !errors.Is(err, snowflake.ErrClockBackwards) || !errors.As(err, &cbe) || cbe.Back != 2*time.Second {
		t.Fatalf("after a 2s step back: %v, want ClockBackwardsError{Back: 2s}", err)
	}
	// Still behind: still refused. Then past the last millisecond: ids again.
	clk.set(lastMs.Add(-time.Second), 0)
	if _, err := g.Next(); !errors.Is(err, snowflake.ErrClockBackwards) {
		t.Fatalf("1s behind: %v", err)
	}
	clk.set(lastMs.Add(time.Millisecond), 0)
	if third := next(t, g); third <= second {
		t.Fatalf("after recovery: id %d <= %d", third, second)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []hookCall{{30 * time.Millisecond, true}, {2 * time.Second, false}, {time.Second, false}}
	if len(calls) != len(want) {
		t.Fatalf("hook calls %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Fatalf("hook calls %v, want %v", calls, want)
		}
	}
}

// TestClockBackwardsNoWaitRefusesAnyStep: MaxBackwards < 0 refuses even a
// 1ms step.
func TestClockBackwardsNoWaitRefusesAnyStep(t *testing.T) {
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	clk := &scriptClock{}
	clk.set(base, 0)
	g := newGen(t, snowflake.Config{Clock: clk, MaxBackwards: -1})
	next(t, g)
	clk.set(base.Add(-time.Millisecond), 0)
	if _, err := g.Next(); !errors.Is(err, snowflake.ErrClockBackwards) {
		t.Fatalf("err = %v", err)
	}
}

// TestRandomClockNeverDuplicates: property: under a clock that jumps
// forwards and backwards at random (steps back both within and beyond
// MaxBackwards), every id Next returns is larger than the one before.
func TestRandomClockNeverDuplicates(t *testing.T) {
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	clk := &randClock{t: base, seed: 42}
	g := newGen(t, snowflake.Config{Clock: clk, MaxBackwards: 5 * time.Millisecond,
		Layout: snowflake.Layout{TimeBits: 45, WorkerBits: 10, SequenceBits: 8}})
	prev := snowflake.ID(-1)
	ok, refused := 0, 0
	for range 20000 {
		id, err := g.Next()
		if err != nil {
			if !errors.Is(err, snowflake.ErrClockBackwards) {
				t.Fatal(err)
			}
			refused++
			continue
		}
		ok++
		if id <= prev {
			t.Fatalf("id %d after %d", id, prev)
		}
		prev = id
	}
	if refused == 0 || ok < 5000 {
		t.Fatalf("%d ids, %d refusals: the clock did not exercise both paths", ok, refused)
	}
}

// randClock moves by a random step per read: mostly forwards by 0-300µs,
// sometimes back by up to 3ms (waited out) or 20ms (refused).
type randClock struct {
	mu   sync.Mutex
	t    time.Time
	seed uint64
}

func (c *randClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seed = c.seed*6364136223846793005 + 1442695040888963407
	r := c.seed >> 33
	switch {
	case r%1000 == 0:
		c.t = c.t.Add(-20 * time.Millisecond)
	case r%100 == 0:
		c.t = c.t.Add(-time.Duration(r%3000) * time.Microsecond)
	default:
		c.t = c.t.Add(time.Duration(r%300) * time.Microsecond)
	}
	return c.t
}

func TestClosedGenerator(t *testing.T) {
	g := newGen(t, snowflake.Config{})
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Next(); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestExhausted(t *testing.T) {
	l := snowflake.Layout{TimeBits: 41, WorkerBits: 10, SequenceBits: 12}
	clk := &scriptClock{}
	clk.set(l.End(), 0) // default epoch + 2^41 ms
	g := newGen(t, snowflake.Config{Layout: l, Clock: clk})
	if _, err := g.Next(); !errors.Is(err, snowflake.ErrExhausted) {
		t.Fatalf("past the end: %v", err)
	}
	clk.set(snowflake.DefaultEpoch.Add(-time.Hour), 0)
	if _, err := g.Next(); !errors.Is(err, snowflake.ErrExhausted) {
		t.Fatalf("before the epoch: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []snowflake.Config{
		{Worker: 1024},
		{Worker: -1},
		{Lease: time.Second, Heartbeat: 600 * time.Millisecond},
		{LeaseName: "bad name"},
		{Layout: snowflake.Layout{TimeBits: 1, WorkerBits: 1, SequenceBits: 1}},
	} {
		if err := c.Validate(); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", c, err)
		}
	}
	if err := (snowflake.Config{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
}
