package rabbitbroker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/rabbitbroker"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
)

// admin is a connection for declaring and deleting test topology; it
// lives for the whole run, so the per-test leak checks do not see it.
var admin *amqp.Connection

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	var err error
	admin, err = amqp.Dial(rabbitbroker.RabbitURL())
	if err != nil {
		fmt.Fprintf(os.Stderr, "rabbitbroker tests need RabbitMQ at %s: %v\n", rabbitbroker.RabbitURL(), err)
		return 1
	}
	code := m.Run()
	admin.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var seq atomic.Int64

// unique is a name unique to this run, readable in rabbitmqctl.
func unique(t testing.TB, prefix string) string {
	n := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return fmt.Sprintf("%s-%s-%d-%d", prefix, n, time.Now().UnixNano()%1e9, seq.Add(1))
}

// topo is one test's exchange and queue names, deleted at cleanup.
type topo struct {
	Exchange, Topic string
}

func newTopo(t testing.TB) topo {
	x := topo{Exchange: unique(t, "idemtest-x"), Topic: unique(t, "topic")}
	t.Cleanup(func() { deleteExchange(t, x.Exchange) })
	return x
}

// subConfig is a subscriber config on x with the adapter's defaults, a
// queue for group, quiet logs and a fast first reconnect; the queue and
// everything it declares are deleted at cleanup.
func (x topo) subConfig(t testing.TB, group string) rabbitbroker.SubscriberConfig {
	cfg := rabbitbroker.SubscriberConfig{
		Conn:     rabbitbroker.Conn{URL: rabbitbroker.RabbitURL(), Logger: quiet(), Name: unique(t, "idemtest-conn")},
		Exchange: x.Exchange,
		Queue:    x.Exchange + "." + group,
		Topics:   []string{x.Topic},
	}
	t.Cleanup(func() { deleteQueues(t, cfg) })
	return cfg
}

func (x topo) pubConfig() rabbitbroker.PublisherConfig {
	return rabbitbroker.PublisherConfig{Conn: rabbitbroker.Conn{URL: rabbitbroker.RabbitURL(), Logger: quiet()}, Exchange: x.Exchange}
}

func (x topo) publisher(t testing.TB) *rabbitbroker.Publisher {
	t.Helper()
	p, err := rabbitbroker.NewPublisher(x.pubConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func subscriber(t testing.TB, cfg rabbitbroker.SubscriberConfig) *rabbitbroker.Subscriber {
	t.Helper()
	s, err := rabbitbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatalf("subscriber not ready: %v", err)
	}
	return s
}

func adminChannel(t testing.TB) *amqp.Channel {
	t.Helper()
	ch, err := admin.Channel()
	if err != nil {
		t.Fatalf("admin channel: %v", err)
	}
	return ch
}

// deleteQueues deletes cfg's queue, dead-letter queue and exchange and
// every delay queue it may have declared.
func deleteQueues(t testing.TB, cfg rabbitbroker.SubscriberConfig) {
	ch := adminChannel(t)
	defer ch.Close()
	names := []string{cfg.Queue, cfg.Queue + ".dlq"}
	for _, b := range rabbitbroker.DefaultDelayBuckets {
		names = append(names, cfg.DelayQueue(b))
	}
	for _, b := range cfg.DelayBuckets {
		names = append(names, cfg.DelayQueue(b))
	}
	for _, n := range names {
		if _, err := ch.QueueDelete(n, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", n, err)
			return
		}
	}
	if err := ch.ExchangeDelete(cfg.Queue+".dlx", false, false); err != nil {
		t.Errorf("delete exchange %s.dlx: %v", cfg.Queue, err)
	}
}

func deleteExchange(t testing.TB, name string) {
	ch := adminChannel(t)
	defer ch.Close()
	if err := ch.ExchangeDelete(name, false, false); err != nil {
		t.Errorf("delete exchange %s: %v", name, err)
	}
}

// queueDepth is the number of ready messages in q.
func queueDepth(t testing.TB, q string) int {
	t.Helper()
	ch := adminChannel(t)
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue %s: %v", q, err)
	}
	return info.Messages
}

// closeConnections closes, from the server side (rabbitmqctl
// close_connection), every connection whose client-provided name is name,
// and returns how many it closed. Only the test's own connections: the
// shared server is never stopped and no other connection is touched.
func closeConnections(t testing.TB, node, name string) int {
	t.Helper()
	args := []string{"-q", "list_connections", "--no-table-headers", "pid", "client_properties"}
	if node != "" {
		args = append([]string{"-n", node}, args...)
	}
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	n := 0
	for line := range strings.Lines(string(out)) {
		pid, props, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if !ok || !strings.Contains(props, `{"connection_name","`+name+`"}`) {
			continue
		}
		args := []string{"close_connection", pid, "idem test: server-side close"}
		if node != "" {
			args = append([]string{"-n", node}, args...)
		}
		if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl close_connection %s: %v\n%s", pid, err, out)
		}
		n++
	}
	return n
}

// queueCounts reads q's ready and unacknowledged messages with rabbitmqctl
// (queue.declare-ok only counts the ready ones).
func queueCounts(t testing.TB, q string) (ready, unacked int) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSpace(line), "\t")
		if len(f) == 3 && f[0] == q {
			r, err1 := strconv.Atoi(f[1])
			u, err2 := strconv.Atoi(f[2])
			if err1 != nil || err2 != nil {
				t.Fatalf("rabbitmqctl list_queues: %q", line)
			}
			return r, u
		}
	}
	t.Fatalf("queue %s not listed", q)
	return 0, 0
}
