// Package servers starts and restarts the servers the fault harness owns:
// a PostgreSQL cluster, redis-server, nats-server, MariaDB and the
// harness's own store-server processes, each in a temporary directory on a
// port of its own. It never touches the machine's shared servers.
package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Proc is one server process, restartable with the same arguments.
type Proc struct {
	Name string
	Path string
	Args []string
	Env  []string
	Dir  string
	Log  string     // stdout and stderr are appended here
	User *user.User // run as this user (when the harness is root); nil: as ourselves

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts the process. It fails if it is running.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s: already running", p.Name)
		}
	}
	lf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Dir = p.Dir
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Own process group, so a ^C to the harness does not reach it
	// before the harness has cleaned up in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if p.User != nil && os.Geteuid() == 0 {
		uid, _ := strconv.Atoi(p.User.Uid)
		gid, _ := strconv.Atoi(p.User.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	lf.Close()
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Pid is the running process's pid (0 if none).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process (not its group).
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return errors.New(p.Name + ": not started")
	}
	return cmd.Process.Signal(sig)
}

// Wait waits up to d for the process to exit.
func (p *Proc) Wait(d time.Duration) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("%s: still running after %s", p.Name, d)
	}
}

// Stop sends sig, waits up to d, then kills the process.
func (p *Proc) Stop(sig syscall.Signal, d time.Duration) error {
	if !p.Running() {
		return nil
	}
	_ = p.Signal(sig)
	if err := p.Wait(d); err == nil {
		return nil
	}
	_ = p.Signal(syscall.SIGKILL)
	return p.Wait(10 * time.Second)
}

// FreePort returns a TCP port nobody listens on at host right now.
func FreePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// WaitTCP waits until addr accepts connections, the process dies, or
// timeout.
func WaitTCP(ctx context.Context, p *Proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && !p.Running() {
			return fmt.Errorf("%s exited before listening on %s (see %s)", p.Name, addr, p.Log)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: %s not listening after %s: %v", p.Name, addr, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Chown gives path (recursively) to u when the harness is root.
func Chown(path string, u *user.User) error {
	if u == nil || os.Geteuid() != 0 {
		return nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// ServiceUser is the unprivileged user a server runs as when the harness
// is root (PostgreSQL refuses to run as root): name if it exists, else
// nobody.
func ServiceUser(name string) (*user.User, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	if u, err := user.Lookup(name); err == nil {
		return u, nil
	}
	return user.Lookup("nobody")
}
