package mysqltest

import (
	"context"
	"database/sql"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is a mariadbd process of the test's own (its own data directory,
// socket and loopback port), for tests that crash or restart the server:
// the shared server is never touched.
type Server struct {
	t    testing.TB
	Port int
	dir  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// StartServer installs a data directory in a temporary directory
// (mariadb-install-db), starts mariadbd on a free loopback port with root
// and no password, and stops it in t.Cleanup. It fails the test, never
// skips, when the binaries are missing or the server does not come up.
// Run as root, the server runs as root (--user=root).
func StartServer(t testing.TB) *Server {
	t.Helper()
	install := binary(t, "mariadb-install-db")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	small := []string{"--innodb-buffer-pool-size=16M", "--innodb-log-file-size=4M"}
	var user []string
	if os.Geteuid() == 0 {
		user = []string{"--user=root"}
	}
	args := append([]string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal",
		"--skip-test-db"}, append(small, user...)...)
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		t.Fatalf("mysqltest: mariadb-install-db: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("mysqltest: listen: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{t: t, Port: port, dir: dir}
	s.args = append([]string{"--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
		"--skip-name-resolve", "--skip-log-bin", "--max-connections=200",
		"--log-error=" + filepath.Join(dir, "error.log")}, append(small, user...)...)
	t.Cleanup(s.Kill) // first: a server that starts but never answers is stopped too
	s.Start()
	return s
}

func binary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("mysqltest: %s not found in PATH (install mariadb-server): %v", name, err)
	}
	return p
}

// Start (re)starts mariadbd on the same port and data directory and waits
// until it answers a query.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command(binary(s.t, "mariadbd"), s.args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("mysqltest: start mariadbd: %v", err)
	}
	s.cmd = cmd
	done := make(chan struct{})
	s.done = done
	go func() { _ = cmd.Wait(); close(done) }()
	db, err := sql.Open("mysql", DSN(s.Addr(), ""))
	if err != nil {
		s.t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			s.t.Fatalf("mysqltest: mariadbd on %s exited: %v (log: %s)", s.Addr(), cmd.ProcessState, s.log())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("mysqltest: mariadbd on %s did not answer: %v (log: %s)", s.Addr(), err, s.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *Server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "error.log"))
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// Kill stops mariadbd with SIGKILL, as a crash would (the next Start runs
// InnoDB's crash recovery), and waits for it to exit.
func (s *Server) Kill() { s.stop(syscall.SIGKILL) }

// Shutdown stops mariadbd with SIGTERM, its normal shutdown (clients are
// disconnected, then the buffer pool is flushed), and waits for it to exit.
func (s *Server) Shutdown() { s.stop(syscall.SIGTERM) }

func (s *Server) stop(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	<-s.done
	s.cmd = nil
}
