package outboxe2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The relay process: the test binary re-executed with these variables.
const (
	envChild   = "OUTBOXE2E_CHILD"   // "relay"
	envBackend = "OUTBOXE2E_BACKEND" // "postgres" or "mariadb"
	envDSN     = "OUTBOXE2E_DSN"
	envSchema  = "OUTBOXE2E_SCHEMA" // PostgreSQL schema of the outbox table
	envNATS    = "OUTBOXE2E_NATS_URL"
	envNoDedup = "OUTBOXE2E_NODEDUP" // "1": publish without Nats-Msg-Id
	envBatch   = "OUTBOXE2E_BATCH"   // relay batch size
	// envCrash is the crash point: after the n-th publish the broker acked,
	// before the relay marks the batch sent, the process SIGKILLs itself.
	envCrash = "OUTBOXE2E_CRASH_AFTER_PUBLISH"
)

// crashPublisher reports every acked publish on stdout ("PUBLISHED id...")
// and kills the process at the crash point.
type crashPublisher struct {
	inner   broker.Publisher
	mu      sync.Mutex
	n       int
	crashAt int
}

func (p *crashPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := p.inner.Publish(ctx, msgs...); err != nil {
		return err
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	os.Stdout.WriteString("PUBLISHED " + strings.Join(ids, " ") + "\n") // one write: atomic on a pipe
	p.n++
	if p.n == p.crashAt {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL) // after publish, before mark-sent
		select {}
	}
	return nil
}

func (p *crashPublisher) Close() error { return p.inner.Close() }

// runChild is the relay process's main; it returns the exit code.
func runChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "relay process:", err); return 2 }
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ob, closeDB, err := openBox()
	if err != nil {
		return fail(err)
	}
	defer closeDB()
	nc, err := nats.Connect(os.Getenv(envNATS), nats.Timeout(5*time.Second))
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js, NoDedup: os.Getenv(envNoDedup) == "1", Logger: e2etest.Quiet()})
	if err != nil {
		return fail(err)
	}
	crashAt, _ := strconv.Atoi(os.Getenv(envCrash))
	batch, _ := strconv.Atoi(os.Getenv(envBatch))
	relay, err := outbox.New(outbox.Config{Backend: ob, Publisher: &crashPublisher{inner: pub, crashAt: crashAt},
		BatchSize: batch, PollInterval: 20 * time.Millisecond, Logger: e2etest.Quiet()})
	if err != nil {
		return fail(err)
	}
	os.Stdout.WriteString("READY\n")
	if err := relay.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}
