package outboxe2e

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/mysqlstore/mysqloutbox"
	"github.com/idem-dev/idem/mysqlstore/mysqltest"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/pgstore"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(runChild())
	}
	_ = mysql.SetLogger(log.New(io.Discard, "", 0)) // killed connections are expected
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// natsURL is the shared JetStream server; NATS_URL overrides it.
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

var seq atomic.Int64

func uniq(prefix string) string {
	return fmt.Sprintf("%s_%d_%d_%d", prefix, os.Getpid(), time.Now().UnixNano()%1e9, seq.Add(1))
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// connectJS connects to url (reconnecting for ever, quickly) and closes the
// connection at cleanup. It fails the test when the server is unreachable.
func connectJS(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("JetStream at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// newStream makes a file-backed stream on subjects name.> (deleted at
// cleanup) and returns its name.
func newStream(t testing.TB, js jetstream.JetStream) string {
	t.Helper()
	name := uniq("oe2e")
	if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return name
}

func streamCount(t testing.TB, js jetstream.JetStream, name string) int {
	t.Helper()
	s, err := js.Stream(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Msgs)
}

// waitConsumed waits until the stream's "ledger" consumer has no message
// left to deliver or to settle.
func waitConsumed(t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	e2etest.WaitFor(t, "the consumer to settle every delivery", 2*time.Minute, func() (bool, string) { return jsConsumed(js, stream) })
}

func jsConsumed(js jetstream.JetStream, stream string) (bool, string) {
	c, err := js.Consumer(context.Background(), stream, "ledger")
	if err != nil {
		return false, err.Error()
	}
	info, err := c.Info(context.Background())
	if err != nil {
		return false, err.Error()
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0,
		fmt.Sprintf("pending %d, ack pending %d, redelivered %d", info.NumPending, info.NumAckPending, info.NumRedelivered)
}

// box is an outbox under test with the business transactions that fill it
// and the environment a relay process needs to open it.
type box struct {
	backend outbox.Backend
	// enqueue commits (or rolls back) one business transaction holding msgs.
	enqueue func(ctx context.Context, commit bool, msgs ...outbox.Message) ([]string, error)
	env     []string
}

// newBox makes an outbox table: on PostgreSQL in the ledger's schema, on
// MariaDB in a fresh database.
func newBox(t testing.TB, backend string, ledger *e2etest.Ledger) box {
	t.Helper()
	switch backend {
	case "postgres":
		cfg := pgoutbox.Config{Pool: ledger.Pool, Schema: ledger.Schema, Table: "outbox", Logger: e2etest.Quiet()}
		if err := pgoutbox.Migrate(ctxT(t), cfg); err != nil {
			t.Fatal(err)
		}
		ob, err := pgoutbox.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return box{backend: ob,
			enqueue: func(ctx context.Context, commit bool, msgs ...outbox.Message) (ids []string, err error) {
				tx, err := ledger.Pool.Begin(ctx)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback(ctx)
				if ids, err = ob.Enqueue(ctx, tx, msgs...); err != nil || !commit {
					return ids, err
				}
				return ids, tx.Commit(ctx)
			},
			env: []string{envBackend + "=postgres", envDSN + "=" + e2etest.PGURL(), envSchema + "=" + ledger.Schema}}
	case "mariadb":
		name, db := mysqltest.NewDB(t)
		cfg := mysqloutbox.Config{DB: db, Table: "outbox", Logger: e2etest.Quiet()}
		if err := mysqloutbox.Migrate(ctxT(t), cfg); err != nil {
			t.Fatal(err)
		}
		ob, err := mysqloutbox.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return box{backend: ob,
			enqueue: func(ctx context.Context, commit bool, msgs ...outbox.Message) (ids []string, err error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback()
				if ids, err = ob.Enqueue(ctx, tx, msgs...); err != nil || !commit {
					return ids, err
				}
				return ids, tx.Commit()
			},
			env: []string{envBackend + "=mariadb", envDSN + "=" + mysqltest.DSN(mysqltest.Addr(), name)}}
	}
	t.Fatalf("unknown backend %q", backend)
	return box{}
}

// openBox opens the outbox a parent described in the environment (in a
// relay process).
func openBox() (outbox.Backend, func(), error) {
	switch os.Getenv(envBackend) {
	case "postgres":
		pool, err := pgxpool.New(context.Background(), os.Getenv(envDSN))
		if err != nil {
			return nil, nil, err
		}
		ob, err := pgoutbox.New(pgoutbox.Config{Pool: pool, Schema: os.Getenv(envSchema), Table: "outbox"})
		return ob, pool.Close, err
	case "mariadb":
		db, err := sql.Open("mysql", os.Getenv(envDSN))
		if err != nil {
			return nil, nil, err
		}
		ob, err := mysqloutbox.New(mysqloutbox.Config{DB: db, Table: "outbox"})
		return ob, func() { db.Close() }, err
	}
	return nil, nil, fmt.Errorf("unknown backend %q", os.Getenv(envBackend))
}

// enqueueRange commits messages from..to-1 (e2etest.Message ids and
// payloads on topic), per transactions of batch.
func enqueueRange(t testing.TB, b box, topic string, from, to, batch int) {
	t.Helper()
	for i := from; i < to; i += batch {
		var msgs []outbox.Message
		for j := i; j < min(i+batch, to); j++ {
			m := e2etest.Message(topic, j)
			msgs = append(msgs, outbox.Message{ID: m.ID, Topic: topic, Payload: m.Payload})
		}
		if _, err := b.enqueue(ctxT(t), true, msgs...); err != nil {
			t.Fatal(err)
		}
	}
}

func waitDrained(t testing.TB, b outbox.Backend) {
	t.Helper()
	e2etest.WaitFor(t, "the outbox to drain", 2*time.Minute, func() (bool, string) {
		st, err := b.Stats(context.Background())
		return err == nil && st.Pending == 0, fmt.Sprintf("%+v %v", st, err)
	})
}

// newPGStore is a records store in the ledger's schema.
func newPGStore(t testing.TB, ledger *e2etest.Ledger, mod func(*pgstore.Config)) *pgstore.Store {
	t.Helper()
	cfg := pgstore.Config{Pool: ledger.Pool, Schema: ledger.Schema, Table: "idem_records", Logger: e2etest.Quiet()}
	if mod != nil {
		mod(&cfg)
	}
	if err := pgstore.Migrate(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// consume runs a guarded consumer (records in pgstore, effects in the
// ledger) on the stream's durable "ledger" until stop is called.
func consume(t testing.TB, ledger *e2etest.Ledger, js jetstream.JetStream, stream string, guard *idem.Guard) (stop func()) {
	t.Helper()
	sub, err := natsbroker.NewSubscriber(ctxT(t), natsbroker.SubscriberConfig{JS: js, Stream: stream, Durable: "ledger",
		AckWait: 5 * time.Second, MaxDeliver: -1, PollWait: 500 * time.Millisecond, Logger: e2etest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return run(t, ledger.ConsumerConfig(sub, guard, e2etest.Single), sub.Close)
}

func run(t testing.TB, cfg consumer.Config, closeSub func() error) (stop func()) {
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("consumer Run: %v", err)
			}
			_ = closeSub()
		})
	}
	t.Cleanup(stop)
	return stop
}

// child is a relay process.
type child struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	count  map[string]int // message id -> times this process published it
	exited chan struct{}  // closed when the process has exited; err is then set
	err    error
}

// startRelay starts the test binary as a relay process with env, and waits
// for it to say READY.
func startRelay(t testing.TB, env ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^$")
	cmd.Env = append(append(os.Environ(), envChild+"=relay"), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, count: map[string]int{}, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "READY":
				close(ready)
			case strings.HasPrefix(line, "PUBLISHED "):
				c.mu.Lock()
				for _, id := range strings.Fields(line)[1:] {
					c.count[id]++
				}
				c.mu.Unlock()
			}
		}
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	select {
	case <-ready:
	case <-c.exited:
		t.Fatalf("relay process exited before READY: %v", c.err)
	case <-time.After(time.Minute):
		t.Fatal("relay process not READY within a minute")
	}
	return c
}

// published is a copy of how often this process published each id.
func (c *child) published() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.count))
	for k, v := range c.count {
		out[k] = v
	}
	return out
}

// stop sends SIGTERM and waits for a clean exit.
func (c *child) stop(t testing.TB) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		if c.err != nil {
			t.Fatalf("relay process: %v", c.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("relay process did not stop on SIGTERM")
	}
}
