package natsbroker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

// natsURL is the JetStream server the tests use; NATS_URL overrides it.
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// natsServer is one JetStream server the tests run against.
type natsServer struct {
	name string // "shared 2.9.10", "embedded 2.15.3"
	nc   *nats.Conn
	js   jetstream.JetStream
}

var (
	// shared is the machine's server (NATS_URL), embedded a current
	// release started in this process: the adapter must work on both.
	shared, embedded *natsServer
	// nc and js are shared's, for the tests that run on one server.
	nc *nats.Conn
	js jetstream.JetStream
)

// servers lists the servers the cross-version tests run on.
func servers() []*natsServer { return []*natsServer{shared, embedded} }

func connect(name, url string) (*natsServer, error) {
	c, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("natsbroker tests need JetStream at %s: %w", url, err)
	}
	j, err := jetstream.New(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	s := &natsServer{name: name + " " + c.ConnectedServerVersion(), nc: c, js: j}
	// The first async publish starts the JetStream context's reply
	// subscription, which lives as long as js; start it now so the
	// per-test leak checks do not see it as new.
	if err := s.warmUp(); err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

// startEmbedded runs a current nats-server (the module's
// github.com/nats-io/nats-server/v2) in this process, JetStream on, its
// store in a fresh temporary directory, on a free loopback port.
func startEmbedded() (*server.Server, string, error) {
	dir, err := os.MkdirTemp("", "natsbroker-js-")
	if err != nil {
		return nil, "", err
	}
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		NoLog: true, NoSigs: true,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		os.RemoveAll(dir)
		return nil, "", errors.New("embedded nats-server not ready within 10s")
	}
	return s, dir, nil
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if shared, err = connect("shared", natsURL()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	nc, js = shared.nc, shared.js
	srv, dir, err := startEmbedded()
	if err != nil {
		fmt.Fprintln(os.Stderr, "embedded nats-server:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if embedded, err = connect("embedded", srv.ClientURL()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	shared.nc.Close()
	embedded.nc.Close()
	srv.Shutdown()
	srv.WaitForShutdown()
	if code == 0 {
		if err := goleak.Find(embeddedServerGoroutines()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// embeddedServerGoroutines ignores the embedded server's own goroutines,
// which start with each stream and consumer and end a moment after they
// are deleted (or the server shuts down): the leak checks are about the
// adapter's goroutines.
func embeddedServerGoroutines() []goleak.Option {
	const pkg = "github.com/nats-io/nats-server/v2/server"
	var opts []goleak.Option
	for _, f := range []string{
		".(*Server).startGoRoutine.func1",
		".(*stream).signalConsumersLoop",
		".(*stream).internalLoop",
		".(*fileStore).flushStreamStateLoop",
		".(*consumerFileStore).flushLoop",
		".(*consumer).processInboundAcks",
		".(*consumer).processInboundNextMsgReqs",
		".(*consumer).loopAndGatherMsgs",
		".(*msgBlock).spinUpFlushLoop",
		".(*fileStore).flushLoop",
		"/ats.Register.func1",
	} {
		opts = append(opts, goleak.IgnoreAnyFunction(pkg+f))
	}
	return opts
}

var seq atomic.Int64

// uniqueName is a stream/subject-safe name unique to this run.
func uniqueName(t testing.TB, prefix string) string {
	n := strings.NewReplacer("/", "_", " ", "_", ".", "_").Replace(t.Name())
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return fmt.Sprintf("%s_%s_%d_%d", prefix, n, time.Now().UnixNano()%1e9, seq.Add(1))
}

// newStream creates a stream on the shared server (see newStreamOn).
func newStream(t testing.TB, mutate func(*jetstream.StreamConfig)) string {
	t.Helper()
	return shared.newStream(t, mutate)
}

// newStream creates a stream on subject(s) `name.>` and `name`, deleted in
// cleanup.
func (s *natsServer) newStream(t testing.TB, mutate func(*jetstream.StreamConfig)) string {
	t.Helper()
	name := uniqueName(t, "idemtest")
	cfg := jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{name, name + ".>"},
		Storage:  jetstream.FileStorage,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("create stream %s on %s: %v", name, s.name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.js.DeleteStream(ctx, name); err != nil {
			t.Errorf("delete stream %s on %s: %v", name, s.name, err)
		}
	})
	return name
}

func (s *natsServer) warmUp() error {
	js := s.js
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := fmt.Sprintf("idemtest_warmup_%d", time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.MemoryStorage}); err != nil {
		return fmt.Errorf("warm-up stream: %w", err)
	}
	defer js.DeleteStream(context.Background(), name)
	f, err := js.PublishAsync(name, nil)
	if err != nil {
		return err
	}
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
