package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-dev/idem/chaos/internal/netns"
	"github.com/idem-dev/idem/chaos/internal/shm"
)

// incarnation is one process of a worker.
type incarnation struct {
	pid    int
	ctr    *shm.File
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{}
	expect atomic.Bool // the harness killed or stopped it on purpose
	killed bool        // it died of SIGKILL
	final  shm.Values
}

// worker is a consumer or relay process the harness starts, kills and
// restarts; each process (incarnation) has its own counter file.
type worker struct {
	name string
	exe  string
	spec Spec
	dir  string
	ns   *netns.NS
	// crashEnv returns EnvCrash for the next incarnation ("" for none).
	crashEnv func() string

	mu    sync.Mutex
	incs  []*incarnation
	clock time.Duration
}

func (w *worker) cur() *incarnation {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.incs) == 0 {
		return nil
	}
	return w.incs[len(w.incs)-1]
}

// start starts a new incarnation and waits until it is ready.
func (w *worker) start() error {
	exe := w.exe
	w.mu.Lock()
	n := len(w.incs)
	w.mu.Unlock()
	spec := w.spec
	spec.Shm = filepath.Join(w.dir, fmt.Sprintf("%s.%d.shm", w.name, n))
	ctr, err := shm.Create(spec.Shm)
	if err != nil {
		return err
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	argv := []string{exe}
	if w.ns != nil {
		argv = w.ns.Command(exe)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), EnvRole+"="+spec.Role, EnvSpec+"="+string(js))
	if w.crashEnv != nil {
		if c := w.crashEnv(); c != "" {
			cmd.Env = append(cmd.Env, EnvCrash+"="+c)
		}
	}
	if w.clock != 0 {
		cmd.Env = append(cmd.Env, EnvClock+"="+w.clock.String())
	}
	lf, err := os.OpenFile(filepath.Join(w.dir, w.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(lf, "=== incarnation %d %s\n", n, time.Now().Format(time.RFC3339Nano))
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		lf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	lf.Close()
	inc := &incarnation{pid: cmd.Process.Pid, ctr: ctr, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			inc.killed = true
		}
		inc.final = ctr.Snapshot()
		close(inc.done)
	}()
	w.mu.Lock()
	w.incs = append(w.incs, inc)
	w.mu.Unlock()
	deadline := time.Now().Add(2 * time.Minute)
	for ctr.Get(shm.Ready) == 0 {
		select {
		case <-inc.done:
			return fmt.Errorf("%s exited before it was ready (see %s)", w.name, filepath.Join(w.dir, w.name+".log"))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 2m", w.name)
		}
	}
	if ctr.Get(shm.Pid) != int64(inc.pid) {
		return fmt.Errorf("%s: the counters say pid %d, the process is %d (is ip netns exec forking?)", w.name, ctr.Get(shm.Pid), inc.pid)
	}
	return nil
}

func (inc *incarnation) exited() bool {
	select {
	case <-inc.done:
		return true
	default:
		return false
	}
}

func (inc *incarnation) signal(sig syscall.Signal) error { return inc.cmd.Process.Signal(sig) }

// freezeAndKill stops the process and reads its counters (frozen: exactly
// what it holds); while they show none of the work holds looks for, it
// lets the process go on for a moment and stops it again, for up to
// patience; then it kills it with SIGKILL and returns what it held.
func (w *worker) freezeAndKill(holds func(shm.Values) bool, patience time.Duration) (shm.Values, error) {
	inc := w.cur()
	if inc == nil || inc.exited() {
		return shm.Values{}, errors.New(w.name + " is not running")
	}
	inc.expect.Store(true)
	deadline := time.Now().Add(patience)
	var v shm.Values
	for {
		if err := inc.signal(syscall.SIGSTOP); err != nil {
			return shm.Values{}, err
		}
		time.Sleep(5 * time.Millisecond) // let the stop land on every thread
		v = inc.ctr.Snapshot()
		if holds(v) || time.Now().After(deadline) {
			break
		}
		_ = inc.signal(syscall.SIGCONT)
		time.Sleep(time.Duration(5+len(w.name)%7) * time.Millisecond)
	}
	if err := inc.signal(syscall.SIGKILL); err != nil {
		return v, err
	}
	<-inc.done
	if !inc.killed {
		return v, fmt.Errorf("%s did not die of SIGKILL", w.name)
	}
	return v, nil
}

// stop ends the worker gracefully ("stop" on its stdin), killing it after
// timeout.
func (w *worker) stop(timeout time.Duration) {
	inc := w.cur()
	if inc == nil || inc.exited() {
		return
	}
	inc.expect.Store(true)
	_ = inc.signal(syscall.SIGCONT)
	_, _ = io.WriteString(inc.stdin, "stop\n")
	select {
	case <-inc.done:
	case <-time.After(timeout):
		_ = inc.signal(syscall.SIGKILL)
		<-inc.done
	}
}

// send writes a control line to the running incarnation.
func (w *worker) send(line string) error {
	inc := w.cur()
	if inc == nil || inc.exited() {
		return errors.New(w.name + " is not running")
	}
	_, err := io.WriteString(inc.stdin, line+"\n")
	return err
}

// totals sums the counters of every incarnation (final values of the dead
// ones, current values of the live one).
func (w *worker) totals() shm.Values {
	w.mu.Lock()
	defer w.mu.Unlock()
	var vs []shm.Values
	for _, inc := range w.incs {
		if inc.exited() {
			vs = append(vs, inc.final)
		} else {
			vs = append(vs, inc.ctr.Snapshot())
		}
	}
	return shm.Sum(vs...)
}

// pids is every pid this worker ran as.
func (w *worker) pids() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int, len(w.incs))
	for i, inc := range w.incs {
		out[i] = inc.pid
	}
	return out
}
