package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idem-dev/idem"
)

// The model: leases and TTLs are long enough never to lapse during the
// check, so each key is a small deterministic state machine. Tokens are
// chosen by the store; the model only requires a new one to exceed every
// token issued before for the key.

type opKind uint8

const (
	opClaim opKind = iota
	opComplete
	opRelease
	opFail
	opGet
	opDelete
)

func (k opKind) String() string {
	return [...]string{"claim", "complete", "release", "fail", "get", "delete"}[k]
}

type linInput struct {
	kind   opKind
	key    string
	token  uint64
	result string
}

// errKind reduces errors to what the model distinguishes.
type errKind uint8

const (
	errNone errKind = iota
	errNotFound
	errFenced
)

type linOutput struct {
	err     errKind
	outcome idem.Outcome // claim
	state   idem.State   // get
	token   uint64       // claim (acquired, completed), get
	result  string       // claim (completed), get
}

type linState struct {
	exists    bool
	state     idem.State
	token     uint64 // current token
	lastToken uint64 // largest token ever issued for the key
	result    string
}

func linStep(s0, in0, out0 any) (bool, any) {
	s, in, out := s0.(linState), in0.(linInput), out0.(linOutput)
	switch in.kind {
	case opClaim:
		if out.err != errNone {
			return false, s
		}
		if !s.exists || s.state == idem.StateReleased {
			if out.outcome != idem.OutcomeAcquired || out.token <= s.lastToken {
				return false, s
			}
			return true, linState{exists: true, state: idem.StateInProgress, token: out.token, lastToken: out.token}
		}
		switch s.state {
		case idem.StateInProgress:
			return out.outcome == idem.OutcomeInProgress, s
		case idem.StateCompleted:
			return out.outcome == idem.OutcomeCompleted && out.result == s.result && out.token == s.token, s
		case idem.StateFailed:
			return out.outcome == idem.OutcomeFailed, s
		}
		return false, s
	case opComplete, opRelease, opFail:
		if !s.exists {
			return out.err == errNotFound, s
		}
		if in.token != s.token {
			return out.err == errFenced, s
		}
		target := map[opKind]idem.State{opComplete: idem.StateCompleted, opRelease: idem.StateReleased, opFail: idem.StateFailed}[in.kind]
		switch s.state {
		case idem.StateInProgress:
			if out.err != errNone {
				return false, s
			}
			n := s
			n.state = target
			if in.kind == opComplete {
				n.result = in.result
			}
			return true, n
		case target:
			return out.err == errNone, s
		}
		return out.err == errFenced, s
	case opGet:
		if !s.exists {
			return out.err == errNotFound, s
		}
		if out.err != errNone || out.state != s.state || out.token != s.token {
			return false, s
		}
		return s.state != idem.StateCompleted || out.result == s.result, s
	case opDelete:
		if out.err != errNone {
			return false, s
		}
		return true, linState{lastToken: s.lastToken}
	}
	return false, s
}

var linModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range h {
			k := op.Input.(linInput).key
			if _, ok := by[k]; !ok {
				order = append(order, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, by[k])
		}
		return out
	},
	Init:  func() any { return linState{} },
	Step:  linStep,
	Equal: func(a, b any) bool { return a.(linState) == b.(linState) },
	DescribeOperation: func(in0, out0 any) string {
		in, out := in0.(linInput), out0.(linOutput)
		return fmt.Sprintf("%s(%s, tok=%d, %q) -> err=%d outcome=%s state=%s tok=%d %q", in.kind, in.key, in.token, in.result, out.err, out.outcome, out.state, out.token, out.result)
	},
}

func classify(err error) (errKind, error) {
	switch {
	case err == nil:
		return errNone, nil
	case errors.Is(err, idem.ErrNotFound):
		return errNotFound, nil
	case errors.Is(err, idem.ErrFenced):
		return errFenced, nil
	}
	return 0, err
}

func (s *suite) testLinearizable(t *testing.T) {
	st := s.store(t)
	const workers = 6
	keys := []string{"lin-a", "lin-b", "lin-c"}
	start := time.Now()
	var (
		mu  sync.Mutex
		ops []porcupine.Operation
	)
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			tokens := map[string][]uint64{} // tokens this worker has seen per key
			ctx := context.Background()
			for i := 0; i < s.feat.LinearizabilityOps; i++ {
				key := keys[rng.IntN(len(keys))]
				in := linInput{key: key}
				switch r := rng.IntN(100); {
				case r < 35:
					in.kind = opClaim
				case r < 55:
					in.kind = opComplete
					in.result = fmt.Sprintf("w%d-%d", w, i)
				case r < 70:
					in.kind = opRelease
				case r < 75:
					in.kind = opFail
				case r < 95:
					in.kind = opGet
				default:
					in.kind = opDelete
				}
				if ts := tokens[key]; len(ts) > 0 {
					in.token = ts[len(ts)-1]
					if rng.IntN(4) == 0 {
						in.token = ts[rng.IntN(len(ts))]
					}
				} else {
					in.token = uint64(rng.IntN(3) + 1)
				}
				call := time.Since(start).Nanoseconds()
				out, err := s.linApply(ctx, st, in)
				ret := time.Since(start).Nanoseconds()
				if err != nil {
					errc <- fmt.Errorf("%s(%s): %w", in.kind, key, err)
					return
				}
				if out.token != 0 {
					tokens[key] = append(tokens[key], out.token)
				}
				mu.Lock()
				ops = append(ops, porcupine.Operation{ClientId: w, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	res := porcupine.CheckOperationsTimeout(linModel, ops, 60*time.Second)
	switch res {
	case porcupine.Ok:
		t.Logf("%d operations linearizable", len(ops))
	case porcupine.Unknown:
		t.Logf("porcupine timed out on %d operations (no violation found)", len(ops))
	default:
		t.Fatalf("history of %d operations is NOT linearizable", len(ops))
	}
}

func (s *suite) linApply(ctx context.Context, st idem.Store, in linInput) (linOutput, error) {
	k := []byte(in.key)
	var out linOutput
	var err error
	switch in.kind {
	case opClaim:
		var c idem.Claim
		c, err = st.Claim(ctx, req(in.key, longLease, longTTL))
		if err == nil {
			out.outcome = c.Outcome
			if c.Outcome == idem.OutcomeAcquired || c.Outcome == idem.OutcomeCompleted {
				out.token = c.Record.Token
			}
			if c.Outcome == idem.OutcomeCompleted {
				out.result = string(c.Record.Result)
			}
		}
	case opComplete:
		err = st.Complete(ctx, k, in.token, []byte(in.result))
	case opRelease:
		err = st.Release(ctx, k, in.token, "")
	case opFail:
		err = st.Fail(ctx, k, in.token, "lin")
	case opGet:
		var r idem.Record
		r, err = st.Get(ctx, k)
		if err == nil {
			out.state, out.token = r.State, r.Token
			if r.State == idem.StateCompleted {
				out.result = string(r.Result)
			}
		}
	case opDelete:
		err = st.Delete(ctx, k)
	}
	out.err, err = classify(err)
	return out, err
}
