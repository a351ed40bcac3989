package e2etest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
)

// Quiet is a logger that drops everything: the runs log thousands of
// expected naks and duplicates.
func Quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// MemStore is a memory store closed at cleanup.
func MemStore(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// NewGuard is a quiet guard on store, closed at cleanup. In a test (not a
// benchmark, whose figures it would change) it keeps evidence: its unusual
// events and its warnings go to the test's recorder, which the ledger logs
// if the test fails (see Ledger.Explain).
func NewGuard(t testing.TB, store idem.Store, opts ...idem.Option) *idem.Guard {
	t.Helper()
	base := []idem.Option{idem.WithLogger(Quiet())}
	if _, bench := t.(*testing.B); !bench {
		ev := evidenceFor(t)
		base = []idem.Option{idem.WithLogger(ev.logger("guard")), idem.WithHooks(ev.hooks("guard"))}
	}
	g, err := idem.NewGuard(store, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// Mode is how the consumer applies effects to the ledger.
type Mode string

const (
	Single Mode = "single" // Handler: one INSERT per message
	Batch  Mode = "batch"  // BatchHandler: one COPY transaction per batch of up to 500
)

// ConsumerConfig is the end-to-end tests' consumer configuration: 16
// workers (4 in batch mode), up to 4,000 messages in flight, keep-alive
// every second and a second's pause while the store is down. Each call
// names a consumer c1, c2... of this ledger: its rows carry the name
// (column member) and its warnings go to the test's evidence.
func (l *Ledger) ConsumerConfig(sub broker.Subscriber, guard *idem.Guard, mode Mode) consumer.Config {
	member := fmt.Sprintf("c%d", l.members.Add(1))
	logger := Quiet()
	if l.ev != nil {
		logger = l.ev.logger(member)
	}
	cfg := consumer.Config{
		Subscriber:         sub,
		Guard:              guard,
		Workers:            16,
		MaxInFlight:        4000,
		FetchBatch:         500,
		InProgressInterval: time.Second,
		StoreDownDelay:     time.Second,
		Logger:             logger,
	}
	if mode == Batch {
		cfg.Workers = 4
		h := l.InsertBatch()
		cfg.BatchHandler = func(ctx context.Context, msgs []*broker.Message) error { return h(WithMember(ctx, member), msgs) }
		cfg.Batch = consumer.BatchConfig{Size: 500, Wait: 10 * time.Millisecond}
	} else {
		h := l.Insert()
		cfg.Handler = func(ctx context.Context, m *broker.Message) ([]byte, error) { return h(WithMember(ctx, member), m) }
	}
	return cfg
}

// WaitFor polls cond every 50ms until it reports done, failing the test
// with what and cond's last state after timeout.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, state := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RunConsumer builds a consumer from cfg and runs it in a goroutine until
// stop, which returns Run's error; cleanup stops it too (stop may be
// called more than once: later calls return the first one's answer).
func RunConsumer(t testing.TB, cfg consumer.Config) (c *consumer.Consumer, stop func() error) {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { _ = stop() })
	return c, stop
}
