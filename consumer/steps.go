package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

// Step is one named step of a multi-step flow. Run gets the results of the
// steps before it (by name) and returns its own.
type Step struct {
	Name string
	Run  func(ctx context.Context, m *broker.Message, results map[string][]byte) ([]byte, error)
}

// Steps builds a Handler from named steps (seed 002's state machine). Each
// step runs through g under its own key, the message's key + "/step:" +
// name, and is recorded when done, so a redelivery after a failure or a
// crash resumes at the first unfinished step: finished steps replay their
// recorded results instead of running again. The handler's result is the
// last step's.
//
// A step whose error is classified as unavailability (the runtime's
// classification: its database or the store could not be reached, or the
// outcome is unknown) keeps its claim: the consumer holds the message and
// runs the handler again later, which resumes that step under the same
// claim, so no attempt of the step's key is spent. Other errors release
// the step's key. Inside a step, idem.TokenFromContext gives the step's
// own fencing token (the claim on the step's key: fence the step's effect
// with it), while TokenFromContext and MessageToken of this package give
// the message's.
//
// Step names must be unique and stable across deployments: renaming one
// makes it run again. A step that failed for good (idem.ErrFailed) fails
// the message permanently, so it is dead-lettered.
func Steps(g *idem.Guard, steps ...Step) (Handler, error) {
	if g == nil {
		return nil, errors.New("consumer: Steps needs a guard")
	}
	if len(steps) == 0 {
		return nil, errors.New("consumer: Steps needs at least one step")
	}
	seen := map[string]bool{}
	for _, s := range steps {
		if s.Name == "" || s.Run == nil {
			return nil, errors.New("consumer: every step needs a Name and a Run")
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("consumer: duplicate step name %q", s.Name)
		}
		seen[s.Name] = true
	}
	return func(ctx context.Context, m *broker.Message) ([]byte, error) {
		key, ok := KeyFromContext(ctx)
		d := deliveryFrom(ctx)
		if !ok || d == nil {
			return nil, errors.New("consumer: Steps handler run outside a Consumer")
		}
		results := make(map[string][]byte, len(steps))
		var last []byte
		for _, s := range steps {
			res, err := runStep(ctx, g, d, derivedKey(key, "step:"+s.Name), s, m, results)
			if err != nil {
				return nil, fmt.Errorf("step %q: %w", s.Name, err)
			}
			results[s.Name] = res
			last = res
		}
		return last, nil
	}, nil
}

// runStep runs one step under its own claim: a claim kept from an earlier
// try of this delivery, or a new one.
func runStep(ctx context.Context, g *idem.Guard, d *delivery, key []byte, s Step, m *broker.Message, results map[string][]byte) ([]byte, error) {
	if val, ok := d.steps.ran(s.Name); ok {
		return val, nil // ran in an earlier try of this delivery; its record is being written
	}
	h := d.steps.take(s.Name)
	if h != nil {
		// Kept across a hold: verify it before the step runs again under
		// it (its heartbeats may have failed past its lease, and another
		// process taken the step over).
		if err := d.c.renew(ctx, h); err != nil {
			if !lost(h) {
				d.keepStep(s.Name, h)
				return nil, err
			}
			h = nil // claim it again: replayed if the other process completed it
		}
	}
	if h == nil {
		var res idem.Result
		var err error
		h, res, err = g.Acquire(ctx, key)
		if err != nil {
			if errors.Is(err, idem.ErrFailed) {
				return nil, idem.Permanent(err)
			}
			return nil, err
		}
		if h == nil {
			return res.Value, nil // done before: replay
		}
	}
	// The step's context carries its claim: idem.TokenFromContext gives the
	// step's own fencing token, the one its effect must be fenced with.
	val, err := runUnder(idem.ContextWithHeld(ctx, h), h, d, func(ctx context.Context) ([]byte, error) { return s.Run(ctx, m, results) })
	if err == nil {
		if verr := idem.ValidateResult(val); verr != nil {
			// The step ran; retrying cannot shrink its result: fail its
			// key for good (never run it again) and the message with it.
			err = idem.Permanent(fmt.Errorf("step result cannot be recorded: %w", verr))
		}
	}
	if err != nil {
		if cerr := d.classify(err); d.transient(cerr) && !lost(h) {
			d.keepStep(s.Name, h)
			return nil, cerr
		}
		if rerr := h.Release(ctx, err); errors.Is(rerr, idem.ErrFailed) {
			return nil, idem.Permanent(errors.Join(err, rerr))
		}
		return nil, err // keeps Permanent marks
	}
	if err := h.Complete(ctx, val); err != nil {
		switch {
		case errors.Is(err, idem.ErrResultTooLarge):
			return nil, idem.Permanent(err) // the key is failed for good
		case errors.Is(err, idem.ErrUnrecorded):
			// The step ran; the guard keeps recording it in the background.
			// Go on, and remember it for later tries of this delivery: its
			// lease may lapse before the record is written, and claiming
			// the key again then would run the step twice.
			d.stepRan(s.Name, val)
			return val, nil
		}
		return nil, err
	}
	return val, nil
}

// runUnder runs fn with a context cancelled with idem.ErrLeaseLost if h is
// lost, turning a panic into an error.
func runUnder(ctx context.Context, h *idem.Held, d *delivery, fn func(context.Context) ([]byte, error)) (val []byte, err error) {
	hctx, stop := watchLease(ctx, h)
	defer stop()
	defer func() {
		if r := recover(); r != nil {
			d.c.log.Error("consumer: step panicked", "msg_id", d.m.ID, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("consumer: step panicked: %v", r)
		}
	}()
	return fn(hctx)
}

// stepState keeps, for the next try of the same delivery, the claims of
// steps whose error was transient and the results of steps that ran but
// whose completion is still being recorded.
type stepState struct {
	held map[string]*idem.Held
	done map[string][]byte
}

// ran returns the result of step name if it ran in an earlier try.
func (s *stepState) ran(name string) ([]byte, bool) {
	if s == nil {
		return nil, false
	}
	v, ok := s.done[name]
	return v, ok
}

// take returns the kept claim of step name, if it is still held.
func (s *stepState) take(name string) *idem.Held {
	if s == nil {
		return nil
	}
	h := s.held[name]
	delete(s.held, name)
	if h != nil && lost(h) {
		return nil
	}
	return h
}

// releaseAll releases every kept claim (the message is given up or failed).
func (s *stepState) releaseAll(ctx context.Context, cause error) {
	if s == nil {
		return
	}
	for name, h := range s.held {
		_ = h.Release(ctx, cause)
		delete(s.held, name)
	}
}

func (d *delivery) keepStep(name string, h *idem.Held) {
	if d.steps == nil {
		d.steps = &stepState{}
	}
	if d.steps.held == nil {
		d.steps.held = map[string]*idem.Held{}
	}
	d.steps.held[name] = h
}

func (d *delivery) stepRan(name string, val []byte) {
	if d.steps == nil {
		d.steps = &stepState{}
	}
	if d.steps.done == nil {
		d.steps.done = map[string][]byte{}
	}
	d.steps.done[name] = val
}

// classify and transient for code that has the delivery but not the
// consumer (Steps).
func (d *delivery) classify(err error) error { return d.c.classify(err) }
func (d *delivery) transient(err error) bool { return d.c.transient(err) }
