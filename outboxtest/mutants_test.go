package outboxtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/memoutbox"
	"github.com/idem-dev/idem/outboxtest"
)

// mutant wraps the memory outbox with one deliberate contract violation.
type mutant struct {
	*memoutbox.Outbox
	kind   string
	mu     sync.Mutex
	cursor int64
}

func (m *mutant) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.Batch, error) {
	if m.kind == "ignore-ordered" {
		req.Ordered = false
	}
	b, err := m.Outbox.Claim(ctx, req)
	if err != nil {
		return nil, err
	}
	mb := &mutantBatch{Batch: b, kind: m.kind, rows: b.Rows()}
	switch m.kind {
	case "cursor": // remembers the largest Seq seen and skips below it
		m.mu.Lock()
		var keep []outbox.Row
		for _, r := range mb.rows {
			if r.Seq > m.cursor {
				keep = append(keep, r)
			}
		}
		for _, r := range mb.rows {
			m.cursor = max(m.cursor, r.Seq)
		}
		m.mu.Unlock()
		mb.rows = keep
	case "no-lock": // hands the rows out without holding them
		_ = b.Release(ctx)
	}
	return mb, nil
}

type mutantBatch struct {
	outbox.Batch
	kind string
	rows []outbox.Row
}

func (b *mutantBatch) Rows() []outbox.Row { return b.rows }

func (b *mutantBatch) Settle(ctx context.Context, s outbox.Settlement) error {
	switch b.kind {
	case "retry-now":
		for i := range s.Retry {
			s.Retry[i].Delay = 0
		}
	case "failed-as-sent":
		for _, f := range s.Failed {
			s.Sent = append(s.Sent, f.Seq)
		}
		s.Failed = nil
	}
	return b.Batch.Settle(ctx, s)
}

func (b *mutantBatch) Release(ctx context.Context) error {
	if b.kind == "release-counts-attempt" {
		var s outbox.Settlement
		for _, r := range b.rows {
			s.Retry = append(s.Retry, outbox.Retry{Seq: r.Seq, Err: "released"})
		}
		if b.Batch.Settle(ctx, s) == nil {
			return nil
		}
	}
	return b.Batch.Release(ctx)
}

const mutantEnv = "OUTBOXTEST_MUTANT"

// TestMutantChild runs the suite against one mutant; only in a child
// process started by TestSuiteCatchesMutants.
func TestMutantChild(t *testing.T) {
	kind := os.Getenv(mutantEnv)
	if kind == "" {
		t.Skip("runs only as a child of TestSuiteCatchesMutants")
	}
	outboxtest.Run(t, func(t testing.TB) outboxtest.Harness {
		ob := memoutbox.New(memoutbox.Config{NewID: outboxtest.NewID()})
		return outboxtest.Harness{
			Backend: &mutant{Outbox: ob, kind: kind},
			Begin:   func(context.Context) (outboxtest.Tx, error) { return memTx{ob.Begin()}, nil },
		}
	}, outboxtest.Features{ConcurrentTx: true, Timeout: 3 * time.Second})
}

// TestSuiteCatchesMutants: the suite fails each mutant, naming the tests
// that caught it.
func TestSuiteCatchesMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("child")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]string{
		"cursor":                 "OutOfOrderCommitNoCursor",
		"no-lock":                "ClaimOrderLimitSkipLocked",
		"release-counts-attempt": "CrashFreesRows",
		"ignore-ordered":         "Ordered",
		"retry-now":              "BackoffSchedule",
		"failed-as-sent":         "ListFailedRequeue",
	} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(exe, "-test.run", "^TestMutantChild$", "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+kind)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed mutant %q", kind)
			}
			if !strings.Contains(string(out), "--- FAIL: TestMutantChild/"+want) {
				t.Fatalf("mutant %q: %s did not fail; output:\n%s", kind, want, out)
			}
			var caught []string
			for _, line := range strings.Split(string(out), "\n") {
				if l := strings.TrimSpace(line); strings.HasPrefix(l, "--- FAIL: TestMutantChild/") {
					caught = append(caught, strings.Fields(strings.TrimPrefix(l, "--- FAIL: TestMutantChild/"))[0])
				}
			}
			t.Logf("mutant %q caught by %v", kind, caught)
		})
	}
}
