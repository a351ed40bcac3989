package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/memstore"
)

// TestStepsResume: step "charge" fails on the first delivery; the retry
// resumes there, and "reserve" (done before the failure) does not run
// again.
func TestStepsResume(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	runs := map[string]int{}
	step := func(name string, failFirst bool) consumer.Step {
		return consumer.Step{Name: name, Run: func(ctx context.Context, m *broker.Message, res map[string][]byte) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			runs[name]++
			if failFirst && runs[name] == 1 {
				return nil, errBoom
			}
			return fmt.Appendf(nil, "%s(%s)", name, res["reserve"]), nil
		}}
	}
	h, err := consumer.Steps(e.guard, step("reserve", false), step("charge", true), step("ship", false))
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config(e.sub("g"))
	cfg.InProcessRetries = 0
	cfg.Handler = h
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("order-1", "x"))
	waitFor(t, "ack", func() bool { return e.log.Acks("order-1") == 1 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	if runs["reserve"] != 1 || runs["charge"] != 2 || runs["ship"] != 1 {
		t.Fatalf("step runs %v, want reserve 1, charge 2, ship 1", runs)
	}
	rec, err := e.store.Get(context.Background(), []byte("order-1"))
	if err != nil || string(rec.Result) != "ship(reserve())" {
		t.Fatalf("record %+v, %v", rec, err)
	}
}

func TestStepsValidation(t *testing.T) {
	e := newEnv(t)
	run := func(context.Context, *broker.Message, map[string][]byte) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		name  string
		steps []consumer.Step
	}{
		{"none", nil},
		{"unnamed", []consumer.Step{{Run: run}}},
		{"no run", []consumer.Step{{Name: "a"}}},
		{"duplicate", []consumer.Step{{Name: "a", Run: run}, {Name: "a", Run: run}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := consumer.Steps(e.guard, tc.steps...); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if _, err := consumer.Steps(nil, consumer.Step{Name: "a", Run: run}); err == nil {
		t.Fatal("accepted a nil guard")
	}
}

// TestStepUnrecordedNotRunAgain: a step ran but the store did not record
// its completion (the guard goes on in the background), and the store
// cannot extend its lease either. The flow must go on from the step's
// result: claiming the step's key again once its lease has lapsed would
// run the step twice.
func TestStepUnrecordedNotRunAgain(t *testing.T) {
	oe := newOutageEnv(t)
	e := oe.env
	cfg := oe.config()
	var mu sync.Mutex
	runs := map[string]int{}
	step := func(name string) consumer.Step {
		return consumer.Step{Name: name, Run: func(ctx context.Context, m *broker.Message, _ map[string][]byte) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			runs[name]++
			return []byte(name), nil
		}}
	}
	h, err := consumer.Steps(e.guard, step("one"), step("two"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Handler = h
	oe.fs.Inject(faultstore.OpComplete, faultstore.Fault{})
	oe.fs.Inject(faultstore.OpExtend, faultstore.Fault{})
	oe.fs.Inject(faultstore.OpExtendBatch, faultstore.Fault{})
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("a", "x"))
	twice := func() bool { mu.Lock(); defer mu.Unlock(); return runs["one"] > 1 || runs["two"] > 1 }
	waitFor(t, "a acked (or a step run twice)", func() bool { return e.log.Acks("a") == 1 || twice() })
	oe.fs.Clear()
	stop()
	mu.Lock()
	defer mu.Unlock()
	if runs["one"] != 1 || runs["two"] != 1 {
		t.Fatalf("step runs %v, want each once", runs)
	}
}

// TestStepTokenInContext: inside a step, idem.TokenFromContext gives the
// step's own fencing token (the token of the claim on the step's key, the
// one a stalled step must be fenced with), also when a step is resumed
// under a claim kept across a hold; consumer.TokenFromContext and
// MessageToken still give the message's.
func TestStepTokenInContext(t *testing.T) {
	// One memstore shard: one token counter for every key. memstore's
	// tokens grow per shard, and keys map to shards by a hash seeded per
	// process, so with the default 64 shards the message's key shared a
	// counter with a step's key in about 1 run in 50 and the message's
	// token came out equal to the other step's. With one counter every
	// claim below gets a token of its own (a store whose counters are per
	// key gives the message 1 and the steps 2).
	st, err := memstore.New(memstore.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := membroker.New(membroker.Config{AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, b, st)
	type seen struct {
		step, msg, msgTok uint64
		ok                bool
	}
	var mu sync.Mutex
	got := map[string][]seen{}
	step := func(name string, failFirst bool) consumer.Step {
		return consumer.Step{Name: name, Run: func(ctx context.Context, m *broker.Message, _ map[string][]byte) ([]byte, error) {
			var s seen
			s.step, s.ok = idem.TokenFromContext(ctx)
			s.msg, _ = consumer.TokenFromContext(ctx)
			s.msgTok, _ = consumer.MessageToken(ctx, m)
			mu.Lock()
			defer mu.Unlock()
			got[name] = append(got[name], s)
			if failFirst && len(got[name]) == 1 {
				return nil, fmt.Errorf("database down: %w", idem.ErrUnavailable) // kept claim, resumed later
			}
			return []byte(name), nil
		}}
	}
	h, err := consumer.Steps(e.guard, step("reserve", false), step("charge", true))
	if err != nil {
		t.Fatal(err)
	}
	// An earlier, released claim of each step's key: the steps' tokens
	// differ from the message's.
	for _, name := range []string{"reserve", "charge"} {
		held, _, err := e.guard.Acquire(context.Background(), []byte("order-1/step:"+name))
		if err != nil {
			t.Fatal(err)
		}
		if err := held.Release(context.Background(), errBoom); err != nil {
			t.Fatal(err)
		}
	}
	cfg := e.config(e.sub("g"))
	cfg.Handler = h
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	e.publish(msg("order-1", "x"))
	waitFor(t, "ack", func() bool { return e.log.Acks("order-1") == 1 })
	stop()
	msgRec, err := e.store.Get(context.Background(), []byte("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"reserve", "charge"} {
		rec, err := e.store.Get(context.Background(), []byte("order-1/step:"+name))
		if err != nil {
			t.Fatalf("step %s record: %v", name, err)
		}
		if len(got[name]) == 0 {
			t.Fatalf("step %s never ran", name)
		}
		for i, s := range got[name] {
			if !s.ok || s.step != rec.Token {
				t.Errorf("step %s, run %d: idem.TokenFromContext = %d, %v; want the step's token %d", name, i+1, s.step, s.ok, rec.Token)
			}
			if s.msg != msgRec.Token || s.msgTok != msgRec.Token {
				t.Errorf("step %s, run %d: consumer.TokenFromContext %d, MessageToken %d; want the message's token %d", name, i+1, s.msg, s.msgTok, msgRec.Token)
			}
		}
	}
	if rec, _ := e.store.Get(context.Background(), []byte("order-1/step:reserve")); rec.Token == msgRec.Token {
		t.Fatalf("step and message tokens are both %d: the test cannot tell them apart", rec.Token)
	}
	if len(got["charge"]) != 2 {
		t.Fatalf("charge ran %d times, want 2 (resumed under its kept claim)", len(got["charge"]))
	}
}
