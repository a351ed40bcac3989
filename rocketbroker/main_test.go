package rocketbroker_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/rocketbroker"
	"github.com/idem-dev/idem/rocketbroker/internal/fakerocket"
	"github.com/idem-dev/idem/rocketbroker/internal/remoting"
	"go.uber.org/goleak"
)

// The tests run against the in-process fake (internal/fakerocket) unless
// IDEM_ROCKETMQ_NAMESRV names a real name server (host:port); a real
// cluster also needs IDEM_ROCKETMQ_BROKER, the master broker's host:port,
// to create and delete the tests' topics. Checks that read the fake's
// internals (what is stored in %DLQ%, scheduled messages, request counts)
// are made on the fake only.
const (
	envNamesrv = "IDEM_ROCKETMQ_NAMESRV"
	envBroker  = "IDEM_ROCKETMQ_BROKER"
)

// cluster is what the tests talk to.
type cluster struct {
	fake    *fakerocket.Server // nil on a real cluster
	namesrv string
	broker  string
}

// shared is the package run's cluster: the fake started by TestMain, or
// the real one. Tests isolate themselves with unique topics and groups.
var shared *cluster

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	rocketbroker.SetClientLogger(quiet())
	if ns := os.Getenv(envNamesrv); ns != "" {
		br := os.Getenv(envBroker)
		if br == "" {
			fmt.Fprintf(os.Stderr, "%s is set: set %s to the master broker's host:port too (the tests create their topics there)\n", envNamesrv, envBroker)
			return 1
		}
		shared = &cluster{namesrv: ns, broker: br}
	} else if _, _, child := childParams(); child {
		// A child process of an end-to-end test: it reads the parent's
		// name server from its parameters.
		shared = &cluster{}
	} else {
		f, err := fakerocket.Start(fakerocket.Config{})
		if err != nil {
			fmt.Fprintf(os.Stderr, "fake RocketMQ: %v\n", err)
			return 1
		}
		shared = &cluster{fake: f, namesrv: f.NameServerAddr(), broker: f.BrokerAddr()}
	}
	code := m.Run()
	if shared.fake != nil {
		shared.fake.Close()
	}
	if code == 0 {
		// The library's sleepers are still ignored; nothing else of ours
		// or the fake's may be left.
		if err := goleak.Find(leakOptions()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// leakOptions ignores the client library's goroutines that outlive a
// client's Shutdown by design (docs/rocketbroker.md, "Goroutines"): its
// scheduled tasks sleep 1s (heartbeat), 10s (name server address refresh,
// offset persistence), 1s (orderly queue locking) or ConsumeTimeout
// (expired-message cleaning) before they first look at the done channel;
// its statistics wait for the next minute, hour and month; a pull
// suspended by the broker waits for its answer or the 30s request timeout,
// and a rebalance under way for its consumer list (3s): the connection's
// close does not end them; and the reader of its name
// server connection, which Shutdown does not close, ends when the read
// deadline (120s) passes.
func leakOptions() []goleak.Option {
	var opts []goleak.Option
	for _, f := range []string{
		"internal.(*rmqClient).Start.func1.1",
		"internal.(*rmqClient).Start.func1.3",
		"internal.(*rmqClient).Start.func1.4",
		"consumer.(*pushConsumer).Start.func1.2",
		"consumer.(*pushConsumer).Start.func1.3",
		"consumer.(*pushConsumer).pullMessage",
		"consumer.(*pushConsumer).pullMessage.func1",
		"internal.(*rmqClient).RebalanceIfNotPaused",
		"internal.(*rmqClient).RebalanceImmediately",
		"consumer.(*statsItemSet).init.func4",
		"consumer.(*statsItemSet).init.func5",
		"consumer.(*statsItemSet).init.func6",
		"internal/remote.(*remotingClient).receiveResponse",
	} {
		opts = append(opts, goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/"+f))
	}
	// A package-level cache of the client, with its janitor, from init.
	opts = append(opts, goleak.IgnoreTopFunction("github.com/patrickmn/go-cache.(*janitor).Run"))
	// The shared fake's side of those connections (closed with it at the
	// end of the run, before the run's own leak check).
	for _, f := range []string{"(*conn).serve", "(*conn).serve.func1", "(*Server).notifyLocked.func1"} {
		opts = append(opts, goleak.IgnoreAnyFunction("github.com/idem-dev/idem/rocketbroker/internal/fakerocket."+f))
	}
	return opts
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

var seq atomic.Int64

// unique is a topic or group name unique to this run.
func unique(t testing.TB, prefix string) string {
	n := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return fmt.Sprintf("%s_%s_%d_%d", prefix, n, time.Now().UnixNano()%1e9, seq.Add(1))
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// invoke sends one request to addr over a connection of its own.
func invoke(ctx context.Context, addr string, code int, ext map[string]string) (*remoting.Command, error) {
	c, err := remoting.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Invoke(ctx, &remoting.Command{Code: code, Language: "GO", Version: remoting.ServerVersion, ExtFields: ext})
}

// createTopic creates topic with queues queues on the cluster's broker
// (UPDATE_AND_CREATE_TOPIC, as mqadmin updateTopic does) and deletes it at
// cleanup, from the broker and the name server.
func (c *cluster) createTopic(t testing.TB, topic string, queues int) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	resp, err := invoke(ctx, c.broker, remoting.UpdateAndCreateTopic, map[string]string{
		"topic": topic, "defaultTopic": "TBW102", "readQueueNums": strconv.Itoa(queues), "writeQueueNums": strconv.Itoa(queues),
		"perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})
	if err != nil || resp.Code != remoting.Success {
		t.Fatalf("create topic %s: %v %v", topic, err, resp)
	}
	t.Cleanup(func() { c.deleteTopic(t, topic) })
}

func (c *cluster) deleteTopic(t testing.TB, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, step := range []struct {
		addr string
		code int
	}{{c.broker, remoting.DeleteTopicInBroker}, {c.namesrv, remoting.DeleteTopicInNamesrv}} {
		if resp, err := invoke(ctx, step.addr, step.code, map[string]string{"topic": topic}); err != nil || resp.Code != remoting.Success {
			t.Errorf("delete topic %s (%d): %v %v", topic, step.code, err, resp)
		}
	}
}

// dropGroup deletes group's retry and dead-letter topics at cleanup.
func (c *cluster) dropGroup(t testing.TB, group string) {
	t.Cleanup(func() {
		for _, tp := range []string{remoting.RetryTopic(group), remoting.DLQTopic(group)} {
			if c.fake != nil {
				c.fake.DeleteTopic(tp)
				continue
			}
			c.deleteTopic(t, tp)
		}
	})
}

func (c *cluster) client() rocketbroker.Client {
	return rocketbroker.Client{NameServers: []string{c.namesrv}, Logger: quiet()}
}

// topic is one test's topic on the shared cluster.
type topic struct {
	c    *cluster
	Name string
}

func newTopic(t testing.TB, queues int) topic { return shared.newTopic(t, queues) }

func (c *cluster) newTopic(t testing.TB, queues int) topic {
	name := unique(t, "t")
	c.createTopic(t, name, queues)
	return topic{c: c, Name: name}
}

// startFake starts a fake of the test's own, closed at cleanup.
func startFake(t testing.TB, cfg fakerocket.Config) *cluster {
	t.Helper()
	f, err := fakerocket.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &cluster{fake: f, namesrv: f.NameServerAddr(), broker: f.BrokerAddr()}
}

func (x topic) pubConfig() rocketbroker.PublisherConfig {
	return rocketbroker.PublisherConfig{Client: x.c.client()}
}

// subConfig is a subscriber config with the adapter's defaults for a
// group unique to the test, whose retry and dead-letter topics are
// deleted at cleanup.
func (x topic) subConfig(t testing.TB, group string) rocketbroker.SubscriberConfig {
	g := x.Name + "_" + group
	x.c.dropGroup(t, g)
	return rocketbroker.SubscriberConfig{Client: x.c.client(), Group: g, Topics: []string{x.Name}}
}

func (x topic) publisher(t testing.TB) *rocketbroker.Publisher {
	t.Helper()
	p, err := rocketbroker.NewPublisher(x.pubConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func subscriber(t testing.TB, cfg rocketbroker.SubscriberConfig) *rocketbroker.Subscriber {
	t.Helper()
	s, err := rocketbroker.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.WaitReady(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("subscriber not ready: %v", err)
	}
	return s
}

// childParams is e2etest.ChildParams without the import cycle in
// TestMain's file.
func childParams() (string, string, bool) {
	s := os.Getenv("IDEM_E2E_CHILD")
	return s, os.Getenv("IDEM_E2E_PARAMS"), s != ""
}

// longRuns: IDEM_ROCKET_LONG=1 runs the end-to-end tests at the other
// adapters' sizes and the slow fault tests (TestConnectionCut). The
// default keeps the module's -race run short.
func longRuns() bool { return os.Getenv("IDEM_ROCKET_LONG") == "1" }

// quickTopic is a topic on a fake of the test's own whose delay levels are
// 100ms apart (1s, 5s, 10s... on a real broker), for tests that wait for
// naks; on a real cluster, a topic there.
func quickTopic(t testing.TB, queues int) topic {
	if shared.fake == nil {
		return newTopic(t, queues)
	}
	var levels []time.Duration
	for i := range 18 {
		levels = append(levels, time.Duration(i+1)*100*time.Millisecond)
	}
	return startFake(t, fakerocket.Config{DelayLevels: levels}).newTopic(t, queues)
}
