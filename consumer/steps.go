package consumer

import (
	"context"
	"errors"
	"fmt"

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
// step runs through g under its own key, the message's key + "/" + name,
// and is recorded when done, so a redelivery after a failure or a crash
// resumes at the first unfinished step: finished steps replay their
// recorded results instead of running again. The handler's result is the
// last step's.
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
		if !ok {
			return nil, errors.New("consumer: Steps handler run outside a Consumer")
		}
		results := make(map[string][]byte, len(steps))
		var last []byte
		for _, s := range steps {
			res, err := g.Do(ctx, derivedKey(key, "step:"+s.Name), func(ctx context.Context) ([]byte, error) {
				return s.Run(ctx, m, results)
			})
			if err != nil {
				var he *idem.HandlerError
				if errors.As(err, &he) && !errors.Is(err, idem.ErrFailed) {
					err = he.Err // keeps Permanent marks
				} else if errors.Is(err, idem.ErrFailed) {
					err = idem.Permanent(err)
				}
				return nil, fmt.Errorf("step %q: %w", s.Name, err)
			}
			results[s.Name] = res.Value
			last = res.Value
		}
		return last, nil
	}, nil
}
