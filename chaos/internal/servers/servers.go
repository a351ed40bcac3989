package servers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Server is a server the harness owns and may restart.
type Server struct {
	Proc *Proc
	Host string // where it listens (as seen from the harness)
	Port int
	// Crash stops it the way a crash would (SIGKILL, or PostgreSQL's
	// immediate shutdown, which skips the checkpoint and recovers from the
	// WAL on the next start).
	crash func() error
	ready func(ctx context.Context) error
	// stop, if set, is Close's way (default: SIGTERM, then SIGKILL).
	stop func() error
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Crash stops the server abruptly.
func (s *Server) Crash() error { return s.crash() }

// Start starts it (again) and waits until it accepts connections.
func (s *Server) Start(ctx context.Context) error {
	if err := s.Proc.Start(); err != nil {
		return err
	}
	return s.ready(ctx)
}

// Restart crashes and starts it.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Crash(); err != nil {
		return err
	}
	return s.Start(ctx)
}

// Close stops it for good.
func (s *Server) Close() error {
	if s.stop != nil {
		return s.stop()
	}
	return s.Proc.Stop(syscall.SIGTERM, 20*time.Second)
}

func killer(p *Proc) func() error {
	return func() error {
		if err := p.Signal(syscall.SIGKILL); err != nil {
			return err
		}
		return p.Wait(20 * time.Second)
	}
}

// PGBin finds PostgreSQL's server binaries (the newest major version under
// /usr/lib/postgresql, or the directory of initdb in PATH).
func PGBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb) under /usr/lib/postgresql/*/bin or in PATH")
}

// StartPostgres makes a cluster in dir (initdb, trust auth, user postgres)
// listening on listen (comma-separated addresses; the first one is Host)
// and starts it. It runs as the postgres user when the harness is root.
func StartPostgres(ctx context.Context, dir, listen string) (*Server, error) {
	bin, err := PGBin()
	if err != nil {
		return nil, err
	}
	u, err := ServiceUser("postgres")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := Chown(dir, u); err != nil {
		return nil, err
	}
	host := strings.Split(listen, ",")[0]
	port, err := FreePort(host)
	if err != nil {
		return nil, err
	}
	initdb := &Proc{Name: "initdb", Path: filepath.Join(bin, "initdb"), Log: filepath.Join(dir, "initdb.log"), User: u,
		Args: []string{"-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"}}
	if err := initdb.Start(); err != nil {
		return nil, err
	}
	if err := initdb.Wait(2 * time.Minute); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		return nil, fmt.Errorf("initdb failed (see %s)", initdb.Log)
	}
	// The workers connect from their network namespace's address.
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = hba.WriteString("host all all 0.0.0.0/0 trust\n")
	if cerr := hba.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: "postgres", Path: filepath.Join(bin, "postgres"), Log: filepath.Join(dir, "postgres.log"), User: u,
		Args: []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir,
			"-c", "listen_addresses=" + listen,
			"-c", "max_connections=300", "-c", "shared_buffers=64MB",
			"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on",
			"-c", "max_wal_size=1GB", "-c", "log_min_messages=warning", "-c", "logging_collector=off"}}
	s := &Server{Proc: p, Host: host, Port: port}
	s.crash = func() error {
		// Immediate shutdown: every backend quits at once, nothing is
		// flushed, the next start runs crash recovery. SIGKILL of the
		// postmaster alone would leave its backends running.
		if err := p.Signal(syscall.SIGQUIT); err != nil {
			return err
		}
		return p.Wait(30 * time.Second)
	}
	s.ready = func(ctx context.Context) error { return waitPG(ctx, p, s.Addr()) }
	return s, s.Start(ctx)
}

// waitPG waits until the server answers a startup packet (not just the TCP
// connect: during recovery it accepts and refuses).
func waitPG(ctx context.Context, p *Proc, addr string) error {
	if err := WaitTCP(ctx, p, addr, time.Minute); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, err := pgAccepts(addr)
		if ok {
			return nil
		}
		if time.Now().After(deadline) || !p.Running() {
			return fmt.Errorf("postgres at %s not ready: %v (see %s)", addr, err, p.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pgAccepts sends a startup message and reports whether authentication
// succeeded (trust: AuthenticationOk, 'R' with code 0).
func pgAccepts(addr string) (bool, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	params := "user\x00postgres\x00database\x00postgres\x00\x00"
	msg := make([]byte, 8+len(params))
	n := len(msg)
	msg[0], msg[1], msg[2], msg[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	msg[4], msg[5], msg[6], msg[7] = 0, 3, 0, 0
	copy(msg[8:], params)
	if _, err := c.Write(msg); err != nil {
		return false, err
	}
	r := bufio.NewReader(c)
	typ, err := r.ReadByte()
	if err != nil {
		return false, err
	}
	if typ != 'R' {
		return false, fmt.Errorf("startup answered %q", typ)
	}
	return true, nil
}

// StartRedis starts redis-server on a free port of host with its data in
// dir, every write fsynced to the append-only file before the reply
// (appendfsync always), so a SIGKILL loses nothing acknowledged.
func StartRedis(ctx context.Context, dir, host string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := FreePort(host)
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: "redis-server", Path: bin, Dir: dir, Log: filepath.Join(dir, "redis.log"),
		Args: []string{"--port", strconv.Itoa(port), "--bind", host, "--dir", dir, "--daemonize", "no",
			"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no",
			"--logfile", ""}}
	s := &Server{Proc: p, Host: host, Port: port, crash: killer(p)}
	s.ready = func(ctx context.Context) error {
		deadline := time.Now().Add(time.Minute)
		for {
			if err := WaitTCP(ctx, p, s.Addr(), time.Minute); err != nil {
				return err
			}
			if ok := redisPing(s.Addr()); ok {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redis at %s answers no PING (see %s)", s.Addr(), p.Log)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return s, s.Start(ctx)
}

func redisPing(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// StartNATS starts nats-server (from PATH) with JetStream in dir on a free
// port of host. A SIGKILL keeps what JetStream wrote to its files.
func StartNATS(ctx context.Context, dir, host string) (*Server, error) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return nil, fmt.Errorf("nats-server not in PATH: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := FreePort(host)
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: "nats-server", Path: bin, Dir: dir, Log: filepath.Join(dir, "nats.log"),
		Args: []string{"-js", "-sd", filepath.Join(dir, "js"), "-a", host, "-p", strconv.Itoa(port),
			"-m", "0", "--no_advertise"}}
	s := &Server{Proc: p, Host: host, Port: port, crash: killer(p)}
	s.ready = func(ctx context.Context) error { return WaitTCP(ctx, p, s.Addr(), time.Minute) }
	return s, s.Start(ctx)
}

// StartMariaDB installs a MariaDB data directory in dir
// (mariadb-install-db) and starts mariadbd on a free port of host with its
// own socket, root without a password, and a database named test.
func StartMariaDB(ctx context.Context, dir, host string) (*Server, error) {
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		return nil, err
	}
	daemon, err := exec.LookPath("mariadbd")
	if err != nil {
		return nil, err
	}
	u, err := ServiceUser("mysql")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := Chown(dir, u); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	userArgs := []string{}
	if u != nil {
		userArgs = []string{"--user=" + u.Username}
	}
	inst := &Proc{Name: "mariadb-install-db", Path: install, Log: filepath.Join(dir, "install.log"),
		Args: append([]string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}, userArgs...)}
	if err := inst.Start(); err != nil {
		return nil, err
	}
	if err := inst.Wait(3 * time.Minute); err != nil {
		return nil, err
	}
	port, err := FreePort(host)
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: "mariadbd", Path: daemon, Log: filepath.Join(dir, "mariadbd.log"),
		Args: append([]string{"--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
			"--bind-address=" + host, "--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
			"--skip-name-resolve", "--innodb-buffer-pool-size=64M", "--max-connections=300",
			"--innodb-flush-log-at-trx-commit=1", "--sync-binlog=1", "--log-error=" + filepath.Join(dir, "error.log")}, userArgs...)}
	s := &Server{Proc: p, Host: host, Port: port, crash: killer(p)}
	s.ready = func(ctx context.Context) error { return WaitTCP(ctx, p, s.Addr(), 2*time.Minute) }
	return s, s.Start(ctx)
}

// RabbitServer is RabbitMQ's server script (Debian's package).
const RabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// StartRabbit starts a RabbitMQ node of its own: its own node name, AMQP
// port on host, distribution port, data (RABBITMQ_MNESIA_BASE), logs,
// configuration, no plugins, and HOME in dir (its Erlang cookie); the guest
// user may connect from any address (the workers' namespace is not
// loopback). It registers with the machine's epmd like any node; the shared
// node (5672) is never touched. Its crash is a SIGTERM stop (see below).
func StartRabbit(ctx context.Context, dir, host string) (*Server, error) {
	if _, err := os.Stat(RabbitServer); err != nil {
		return nil, fmt.Errorf("rabbitmq-server: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := FreePort(host)
	if err != nil {
		return nil, err
	}
	dist, err := FreePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("listeners.tcp.1 = %s\nloopback_users = none\n", net.JoinHostPort(host, strconv.Itoa(port)))
	for f, body := range map[string]string{"rabbitmq.conf": conf, "env.conf": "", "enabled_plugins": "[].\n"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	p := &Proc{Name: "rabbitmq-server", Path: RabbitServer, Dir: dir, Log: filepath.Join(dir, "server.out"), Env: []string{
		"HOME=" + dir,
		fmt.Sprintf("RABBITMQ_NODENAME=idemchaos%d_%d@localhost", os.Getpid(), port),
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", dist),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}}
	stop := func() error {
		pid := p.Pid()
		if pid == 0 {
			return errors.New("rabbitmq-server: not started")
		}
		if !p.Running() {
			return nil
		}
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		err := p.Wait(time.Minute)
		_ = syscall.Kill(-pid, syscall.SIGKILL) // erl_child_setup and friends
		if err != nil {
			return p.Wait(10 * time.Second)
		}
		return nil
	}
	// The crash is a stop on SIGTERM (connections closed, unacked
	// deliveries requeued), not a SIGKILL: after a SIGKILL of this single
	// node, quorum queues declared shortly before came back without a
	// leader for good (RabbitMQ 3.10.8, "leader call - leader not known",
	// 2 tries out of 2; rabbitmq-server issue 10070), and the cell could
	// never drain: nothing idem does, and nothing it could recover from.
	s := &Server{Proc: p, Host: host, Port: port, crash: stop, stop: stop}
	s.ready = func(ctx context.Context) error {
		// The port opens once the node has booted; AMQP handshakes
		// work from then on.
		return WaitTCP(ctx, p, s.Addr(), 3*time.Minute)
	}
	return s, s.Start(ctx)
}

// StartChild runs exe (the harness's worker binary) in a server role (the
// store server for the embedded store) with env, listening on a free port
// of host that it is given in IDEM_CHAOS_LISTEN.
func StartChild(ctx context.Context, exe, name, dir, host string, env []string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := FreePort(host)
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: name, Path: exe, Dir: dir, Log: filepath.Join(dir, name+".log"),
		Env: append(env, "IDEM_CHAOS_LISTEN="+net.JoinHostPort(host, strconv.Itoa(port)))}
	s := &Server{Proc: p, Host: host, Port: port, crash: killer(p)}
	s.ready = func(ctx context.Context) error { return WaitTCP(ctx, p, s.Addr(), time.Minute) }
	return s, s.Start(ctx)
}
