package boltstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// The crash test re-executes the test binary as a child that claims and
// completes keys as fast as it can (one by one and with CompleteBatch) and
// prints a line for each completion that returned nil; the parent kills it with SIGKILL at a random moment and
// checks that every printed completion is in the file.
const (
	envChildPath  = "BOLTSTORE_CRASH_CHILD"
	envChildRound = "BOLTSTORE_CRASH_ROUND"
)

// runChild runs the child's loop when the environment asks for it; it never
// returns in the child.
func runChild() bool {
	path := os.Getenv(envChildPath)
	if path == "" {
		return false
	}
	round := os.Getenv(envChildRound)
	s, err := Open(Config{Path: path, LockTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	var mu sync.Mutex
	say := func(format string, a ...any) {
		line := fmt.Sprintf(format+"\n", a...)
		mu.Lock()
		os.Stdout.WriteString(line) // one write per line: atomic on a pipe
		mu.Unlock()
	}
	say("READY")
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := n.Add(1)
				key := fmt.Sprintf("r%s-%d", round, i)
				c, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte(key), Lease: time.Minute, TTL: time.Hour})
				if err != nil || c.Outcome != idem.OutcomeAcquired {
					fmt.Fprintln(os.Stderr, "child claim:", c.Outcome, err)
					os.Exit(3)
				}
				// Most keys complete; some are released or failed, so that
				// every settling operation is checked after the crash.
				switch i % 10 {
				case 3:
					if err := s.Release(ctx, []byte(key), c.Record.Token, "cause-"+key); err != nil {
						fmt.Fprintln(os.Stderr, "child release:", err)
						os.Exit(3)
					}
					say("RELEASED %s", key)
				case 7:
					if err := s.Fail(ctx, []byte(key), c.Record.Token, "cause-"+key); err != nil {
						fmt.Fprintln(os.Stderr, "child fail:", err)
						os.Exit(3)
					}
					say("FAILED %s", key)
				default:
					if err := s.Complete(ctx, []byte(key), c.Record.Token, []byte("result-"+key)); err != nil {
						fmt.Fprintln(os.Stderr, "child complete:", err)
						os.Exit(3)
					}
					say("DONE %s", key)
				}
				if i%16 == 0 {
					// The hot key is taken over (1ms lease) again and again
					// and deleted: its tokens must still grow across crashes.
					h, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("hot"), Lease: time.Millisecond, TTL: time.Hour})
					if err != nil {
						fmt.Fprintln(os.Stderr, "child hot claim:", err)
						os.Exit(3)
					}
					if h.Outcome == idem.OutcomeAcquired {
						say("HOT %d", h.Record.Token)
					}
					if i%64 == 0 {
						if err := s.Delete(ctx, []byte("hot")); err != nil {
							fmt.Fprintln(os.Stderr, "child delete:", err)
							os.Exit(3)
						}
					}
				}
			}
		}()
	}
	// One more worker settles its keys with CompleteBatch: every entry it
	// reports done must be in the file too.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j := 0; ; j++ {
			reqs := make([]idem.ClaimRequest, 4)
			for k := range reqs {
				reqs[k] = idem.ClaimRequest{Key: []byte(fmt.Sprintf("b%s-%d-%d", round, j, k)), Lease: time.Minute, TTL: time.Hour}
			}
			res, err := s.ClaimBatch(ctx, reqs)
			if err != nil {
				fmt.Fprintln(os.Stderr, "child claim batch:", err)
				os.Exit(3)
			}
			cs := make([]idem.Completion, len(reqs))
			for k, r := range res {
				if r.Err != nil || r.Claim.Outcome != idem.OutcomeAcquired {
					fmt.Fprintln(os.Stderr, "child claim batch entry:", r.Claim.Outcome, r.Err)
					os.Exit(3)
				}
				cs[k] = idem.Completion{Key: reqs[k].Key, Token: r.Claim.Record.Token, Result: []byte("result-" + string(reqs[k].Key))}
			}
			errs, err := s.CompleteBatch(ctx, cs)
			if err != nil {
				fmt.Fprintln(os.Stderr, "child complete batch:", err)
				os.Exit(3)
			}
			for k, e := range errs {
				if e != nil {
					fmt.Fprintln(os.Stderr, "child complete batch entry:", e)
					os.Exit(3)
				}
				say("DONE %s", cs[k].Key)
			}
		}
	}()
	wg.Wait()
	os.Exit(0)
	return true
}

func TestCrashKill9(t *testing.T) {
	rounds := 30
	if testing.Short() {
		rounds = 8
	}
	path := filepath.Join(t.TempDir(), "crash.db")
	var maxHot uint64
	total := 0
	for round := 0; round < rounds; round++ {
		done, settled, hots := crashRound(t, path, round)
		s, err := Open(Config{Path: path})
		if err != nil {
			t.Fatalf("round %d: reopen after kill -9: %v", round, err)
		}
		ctx := context.Background()
		for _, key := range done {
			r, err := s.Get(ctx, []byte(key))
			if err != nil {
				t.Fatalf("round %d: acknowledged completion of %q lost: %v", round, key, err)
			}
			if r.State != idem.StateCompleted || string(r.Result) != "result-"+key {
				t.Fatalf("round %d: %q is %s with result %q", round, key, r.State, r.Result)
			}
		}
		for key, state := range settled {
			r, err := s.Get(ctx, []byte(key))
			if err != nil || r.State != state || r.LastError != "cause-"+key {
				t.Fatalf("round %d: acknowledged %s of %q: found %+v, %v", round, state, key, r, err)
			}
		}
		total += len(settled)
		// Tokens of this run must all exceed every earlier run's.
		var roundMax, roundMin uint64 = 0, ^uint64(0)
		for _, tok := range hots {
			roundMax, roundMin = max(roundMax, tok), min(roundMin, tok)
		}
		if len(hots) > 0 && roundMin <= maxHot {
			t.Fatalf("round %d: hot key token %d not above %d from an earlier run", round, roundMin, maxHot)
		}
		maxHot = max(maxHot, roundMax)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		total += len(done)
	}
	t.Logf("%d rounds, %d acknowledged completions, releases and failures checked, highest hot token %d", rounds, total, maxHot)
}

// crashRound runs one child, kills it at a random moment and returns the
// keys whose completion it acknowledged, those it acknowledged releasing or
// failing, and the hot-key tokens it acquired.
func crashRound(t *testing.T, path string, round int) (done []string, settled map[string]idem.State, hots []uint64) {
	settled = map[string]idem.State{}
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChildPath+"="+path, envChildRound+"="+strconv.Itoa(round))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	ready := false
	deadline := time.After(30 * time.Second)
	for !ready {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("round %d: child exited before READY: %s", round, stderr.String())
			}
			ready = l == "READY"
		case <-deadline:
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: child not ready: %s", round, stderr.String())
		}
	}
	if round == 0 {
		// Another process holds the file: Open says so quickly.
		start := time.Now()
		if s, err := Open(Config{Path: path, LockTimeout: 50 * time.Millisecond}); !errors.Is(err, ErrInUse) {
			if err == nil {
				s.Close()
			}
			t.Fatalf("open while the child holds the file: %v", err)
		} else {
			t.Logf("in use after %s: %v", time.Since(start).Round(time.Millisecond), err)
		}
	}
	kill := time.After(time.Duration(5+rand.IntN(200)) * time.Millisecond)
	collect := func(l string) {
		switch {
		case strings.HasPrefix(l, "DONE "):
			done = append(done, strings.TrimPrefix(l, "DONE "))
		case strings.HasPrefix(l, "RELEASED "):
			settled[strings.TrimPrefix(l, "RELEASED ")] = idem.StateReleased
		case strings.HasPrefix(l, "FAILED "):
			settled[strings.TrimPrefix(l, "FAILED ")] = idem.StateFailed
		case strings.HasPrefix(l, "HOT "):
			if v, err := strconv.ParseUint(strings.TrimPrefix(l, "HOT "), 10, 64); err == nil {
				hots = append(hots, v)
			}
		}
	}
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("round %d: child died on its own: %s", round, stderr.String())
			}
			collect(l)
			continue
		case <-kill:
		}
		break
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		collect(l)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("round %d: child ended with %v, want SIGKILL: %s", round, err, stderr.String())
	}
	return done, settled, hots
}
