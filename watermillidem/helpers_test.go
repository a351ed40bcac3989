package watermillidem_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/watermillidem"
	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines, except the cleanup loop of
// Watermill's in-memory deduplicator repository (TestSideBySide runs it),
// which nothing can stop: it runs on context.Background() for ever.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill/message/router/middleware.(*mapExpiringKeyRepository).cleanOutLoop"))
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newStore(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newGuard(t testing.TB, store idem.Store, opts ...idem.Option) *idem.Guard {
	t.Helper()
	g, err := idem.NewGuard(store, append([]idem.Option{idem.WithLogger(quiet())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func newDedup(t testing.TB, cfg watermillidem.Config) *watermillidem.Deduplicator {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	if cfg.RetryWait == 0 {
		cfg.RetryWait = 10 * time.Millisecond
	}
	d, err := watermillidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func msg(uuid, payload string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	m.SetContext(context.Background())
	return m
}

// effects counts handler runs per UUID.
type effects struct {
	mu   sync.Mutex
	runs map[string]int
}

func (e *effects) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.runs == nil {
		e.runs = map[string]int{}
	}
	e.runs[id]++
}

func (e *effects) get(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[id]
}

func (e *effects) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, k := range e.runs {
		n += k
	}
	return n
}

// goChannel is a GoChannel pub/sub closed at cleanup.
func goChannel(t testing.TB) *gochannel.GoChannel {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	return ps
}

// runRouter runs a router with handler h (and middlewares mws, outermost
// first) on topic of sub until the test ends.
func runRouter(t testing.TB, sub message.Subscriber, topic string, mws []message.HandlerMiddleware, h message.NoPublishHandlerFunc) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("h", topic, sub, h)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() {
		r.Close()
		<-done
	})
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
