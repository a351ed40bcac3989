package rabbitbroker_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/rabbitbroker"
	amqp "github.com/rabbitmq/amqp091-go"
)

// node is a RabbitMQ node of the test's own: its own name, AMQP and
// distribution ports, data, log and config in a temporary directory. The
// shared server is never touched.
type node struct {
	name, dir string
	port      int
	env       []string
	cmd       *exec.Cmd
	done      chan error
	log       *os.File
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func newNode(t testing.TB) *node {
	t.Helper()
	if _, err := os.Stat("/usr/lib/rabbitmq/bin/rabbitmq-server"); err != nil {
		t.Fatalf("a node of the test's own needs rabbitmq-server: %v", err)
	}
	dir := t.TempDir()
	n := &node{name: fmt.Sprintf("idemtest%d@localhost", os.Getpid()), dir: dir, port: freePort(t)}
	dist := freePort(t)
	conf := fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\n", n.port)
	for f, body := range map[string]string{"rabbitmq.conf": conf, "env.conf": "", "enabled_plugins": "[].\n"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n.env = append(os.Environ(),
		"HOME="+dir, // the node's Erlang cookie
		"RABBITMQ_NODENAME="+n.name,
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", n.port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	t.Cleanup(func() { n.stop(t) })
	return n
}

func (n *node) url() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// start runs the node in the foreground as a child process and waits
// until it accepts AMQP connections.
func (n *node) start(t testing.TB) {
	t.Helper()
	log, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	n.log = log
	n.cmd = exec.Command("/usr/lib/rabbitmq/bin/rabbitmq-server")
	n.cmd.Env, n.cmd.Dir, n.cmd.Stdout, n.cmd.Stderr = n.env, n.dir, log, log
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group: stop ends it all
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.done = make(chan error, 1)
	go func() { n.done <- n.cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if c, err := amqp.DialConfig(n.url(), amqp.Config{Dial: amqp.DefaultDial(time.Second)}); err == nil {
			c.Close()
			return
		}
		select {
		case err := <-n.done:
			n.done <- err
			t.Fatalf("node %s exited while starting: %v\n%s", n.name, err, n.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not up within 90s\n%s", n.name, n.output())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (n *node) output() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop shuts the node down (SIGTERM to its process group: RabbitMQ stops
// gracefully on it; SIGKILL if it lingers) and waits for it to exit.
// rabbitmqctl is not used: the Debian wrapper runs it as the rabbitmq
// user, whose Erlang cookie is the shared node's, not this one's.
func (n *node) stop(t testing.TB) {
	if n.cmd == nil {
		return
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
	// epmd and the beam's helpers (erl_child_setup, inet_gethost) are in
	// the group too; end whatever is left of it.
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	n.cmd = nil
	n.log.Close()
}

// TestBrokerRestart: a RabbitMQ node of the test's own (other ports, its
// own data directory) is stopped and started again under a running
// subscriber and publisher. Deliveries held unacked across the restart
// cannot be settled (ErrDeliveryLost); while the node is down Publish
// fails within its context; the subscriber and
// publisher reconnect with backoff and declare their topology again; the
// persistent messages published before the restart (held and never
// fetched) are all delivered after it, with Delivery 2 for the held ones.
// Runs with IDEM_RABBIT_LONG=1 (about 20s: two node starts of about 7s
// each), to keep the module's default run short.
func TestBrokerRestart(t *testing.T) {
	if !longRuns() {
		t.Skip("starts a RabbitMQ node of its own (about 20s): IDEM_RABBIT_LONG=1")
	}
	n := newNode(t)
	n.start(t)
	x := topo{Exchange: "idemtest-restart-x", Topic: "restart"}
	conn := rabbitbroker.Conn{URL: n.url(), Logger: quiet(), Reconnect: rabbitbroker.Backoff{Initial: 200 * time.Millisecond, Max: time.Second}}
	cfg := rabbitbroker.SubscriberConfig{Conn: conn, Exchange: x.Exchange, Queue: "restart", Topics: []string{x.Topic}}
	s, err := rabbitbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitReady(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	p, err := rabbitbroker.NewPublisher(rabbitbroker.PublisherConfig{Conn: conn, Exchange: x.Exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	publish(t, p, msgs(x.Topic, "before", 20)...)
	held := fetchN(t, s, 5, 10*time.Second) // 5 in hand, unacked; the rest prefetched or queued

	t.Logf("stopping node %s", n.name)
	n.stop(t)
	if err := p.Publish(ctxT(t, time.Second), msgs(x.Topic, "down", 1)...); err == nil {
		t.Fatal("Publish succeeded with the node down")
	}
	for _, m := range held {
		if err := m.Acker.Ack(ctxT(t, 5*time.Second)); !errors.Is(err, rabbitbroker.ErrDeliveryLost) {
			t.Fatalf("Ack across the restart = %v, want ErrDeliveryLost", err)
		}
	}
	if s.Connected() {
		t.Fatal("subscriber connected with the node down")
	}
	n.start(t)
	if err := s.WaitReady(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	publish(t, p, msgs(x.Topic, "after", 1)...)
	want := map[string]bool{"after-0": true}
	for _, m := range msgs(x.Topic, "before", 20) {
		want[m.ID] = true
	}
	heldIDs := map[string]bool{}
	for _, m := range held {
		heldIDs[m.ID] = true
	}
	got := fetchN(t, s, len(want), 30*time.Second)
	for _, m := range got {
		if !want[m.ID] {
			t.Fatalf("unexpected or repeated delivery %s", m.ID)
		}
		delete(want, m.ID)
		if heldIDs[m.ID] && m.Delivery < 2 {
			t.Errorf("%s was held across the restart; Delivery %d, want >= 2", m.ID, m.Delivery)
		}
		if err := m.Acker.Ack(ctxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if s.Connects() < 2 {
		t.Fatalf("Connects = %d, want a reconnection", s.Connects())
	}
	var _ broker.Subscriber = s
}
