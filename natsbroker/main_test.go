package natsbroker_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

var (
	nc *nats.Conn
	js jetstream.JetStream
)

func TestMain(m *testing.M) {
	var err error
	nc, err = nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		fmt.Fprintf(os.Stderr, "natsbroker tests need JetStream at %s: %v\n", natsURL(), err)
		os.Exit(1)
	}
	js, err = jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The first async publish starts the JetStream context's reply
	// subscription, which lives as long as js; start it now so the
	// per-test leak checks do not see it as new.
	if err := warmUp(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	nc.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
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

// newStream creates a stream on subject(s) `name.>` and `name`, deleted in
// cleanup.
func newStream(t testing.TB, mutate func(*jetstream.StreamConfig)) string {
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
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return name
}

func warmUp() error {
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
