// Package redistest starts real redis-server processes for tests: a single
// node on a free loopback port (for fail-closed tests that stop and restart
// it) and a 3-master Redis Cluster. It fails the test, never skips, when
// redis-server or redis-cli is missing.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SharedAddr is the shared Redis server on the machine.
const SharedAddr = "127.0.0.1:6379"

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	Port int
	dir  string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// FreePort returns a loopback port that is free, and whose cluster bus port
// (port+10000) is free too.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: listen: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p+10000 > 65535 {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		l2.Close()
		return p
	}
	t.Fatal("redistest: no free port pair found")
	return 0
}

func binary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("redistest: %s not found in PATH (install the redis-server / redis-tools package): %v", name, err)
	}
	return p
}

// StartServer starts a redis-server on a free port with extra arguments
// (e.g. "--appendonly", "yes") and stops it in t.Cleanup.
func StartServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{t: t, Port: FreePort(t), dir: t.TempDir()}
	s.args = append([]string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--daemonize", "no",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}, extra...)
	t.Cleanup(s.Stop) // first: a server that starts but never answers is stopped too
	s.Start()
	return s
}

// Start (re)starts the process on the same port and waits until it answers.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command(binary(s.t, "redis-server"), s.args...)
	// Output goes to the log file (--logfile); its tail is shown on failure.
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	s.cmd = cmd
	if err := waitPing(s.Addr(), 10*time.Second); err != nil {
		s.t.Fatalf("redistest: redis-server on %s did not answer: %v (log: %s)", s.Addr(), err, s.log())
	}
}

func (s *Server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop kills the process (SIGKILL: no chance to save, like a crash) and
// waits for it to exit.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

func waitPing(addr string, d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Cluster is a Redis Cluster of real redis-server processes.
type Cluster struct {
	Nodes []*Server
}

// Addrs lists the nodes' addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr()
	}
	return a
}

// StartCluster starts masters redis-server processes with cluster mode on,
// joins them with redis-cli --cluster create (no replicas), waits for
// cluster_state:ok on every node and stops them all in t.Cleanup.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return StartClusterReplicas(t, masters, 0)
}

// StartClusterReplicas is StartCluster with replicas per master; it also
// waits until every replica's link to its master is up. Nodes[:masters]
// are the masters as redis-cli assigns them (the first ones listed).
func StartClusterReplicas(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	cli := binary(t, "redis-cli")
	c := &Cluster{}
	for range masters * (1 + replicas) {
		dir := t.TempDir()
		n := StartServer(t, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000")
		c.Nodes = append(c.Nodes, n)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		for {
			st, err := clusterState(n.Addr())
			if err == nil && st == "ok" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: node %s: cluster_state=%q err=%v", n.Addr(), st, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for replicas > 0 {
		up := 0
		for _, n := range c.Nodes {
			if linkUp(n.Addr()) {
				up++
			}
		}
		if up == masters*replicas {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %d of %d replicas linked", up, masters*replicas)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

func linkUp(addr string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "master_link_status:up")
}

func clusterState(addr string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "cluster_state:"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("no cluster_state in CLUSTER INFO")
}

// DropPrefix deletes every key starting with prefix (on every master of
// a cluster); an error fails the test (Errorf), for use at cleanup.
func DropPrefix(t testing.TB, c redis.UniversalClient, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One pipelined round trip per SCAN page: benchmarks leave hundreds of
	// thousands of keys (UNLINK with many keys would be CROSSSLOT on a cluster).
	del := func(ctx context.Context, n redis.Cmdable) error {
		var cur uint64
		for {
			keys, next, err := n.Scan(ctx, cur, prefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				pipe := n.Pipeline()
				for _, k := range keys {
					pipe.Unlink(ctx, k)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cur = next
		}
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
	} else {
		err = del(ctx, c)
	}
	if err != nil {
		t.Errorf("cleanup of %s*: %v", prefix, err)
	}
}
