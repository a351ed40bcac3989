package outboxe2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/e2etest"
)

// TestRelayCrashAfterPublish: a relay process is SIGKILLed right after the
// broker acked its first batch and before it marked the batch sent. The
// rows stay pending; the next relay process publishes them again (and the
// rest once); a guarded consumer applies every message exactly once. With
// the broker's dedup off the second copies really reach the stream; with
// it on (Nats-Msg-Id = the message id) the broker drops them.
func TestRelayCrashAfterPublish(t *testing.T) {
	for _, tc := range []struct {
		backend string
		dedup   bool
	}{{"postgres", false}, {"postgres", true}, {"mariadb", false}} {
		name := tc.backend + "/dedup-off"
		if tc.dedup {
			name = tc.backend + "/dedup-on"
		}
		t.Run(name, func(t *testing.T) { testCrashAfterPublish(t, tc.backend, tc.dedup) })
	}
}

func testCrashAfterPublish(t *testing.T, backend string, dedup bool) {
	const n, batch = 100, 10
	ledger := e2etest.NewLedger(t, "oe2e_crash")
	_, js := connectJS(t, natsURL())
	stream := newStream(t, js)
	topic := stream + ".orders"
	b := newBox(t, backend, ledger)
	enqueueRange(t, b, topic, 0, n, 7)

	env := append(b.env, envNATS+"="+natsURL(), envBatch+"=10")
	if !dedup {
		env = append(env, envNoDedup+"=1")
	}
	first := startRelay(t, append(env, envCrash+"=1")...)
	<-first.exited
	if ws, ok := first.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("first relay ended with %v, want SIGKILL at the crash point", first.err)
	}
	crashed := first.published()
	if len(crashed) != batch {
		t.Fatalf("first relay published %d messages before dying, want one batch of %d", len(crashed), batch)
	}
	if got := streamCount(t, js, stream); got != batch {
		t.Fatalf("stream holds %d messages after the crash, want %d", got, batch)
	}
	st, err := b.backend.Stats(ctxT(t))
	if err != nil || st.Pending != n {
		t.Fatalf("after the crash: %+v, %v; want all %d still pending (the batch was never marked sent)", st, err, n)
	}

	second := startRelay(t, env...)
	waitDrained(t, b.backend)
	second.stop(t)
	again := second.published()
	for id := range crashed {
		if again[id] != 1 {
			t.Fatalf("crashed message %s published %d times by the second relay, want once more", id, again[id])
		}
	}
	for id, c := range again {
		if c != 1 {
			t.Fatalf("second relay published %s %d times", id, c)
		}
	}
	if len(again) != n {
		t.Fatalf("second relay published %d distinct messages, want %d", len(again), n)
	}
	want := n + batch // the crashed batch twice
	if dedup {
		want = n // the broker dropped the second copies
	}
	if got := streamCount(t, js, stream); got != want {
		t.Fatalf("stream holds %d messages, want %d", got, want)
	}

	guard := e2etest.NewGuard(t, newPGStore(t, ledger, nil), idem.WithLease(10*time.Second))
	stop := consume(t, ledger, js, stream, guard)
	ledger.WaitDistinct(t, "every message applied", n)
	waitConsumed(t, js, stream) // every copy, duplicates included, was handled
	stop()
	ledger.AssertExactlyOnce(t, n)
	t.Logf("%s: crashed batch %s republished; stream %d messages; ledger exactly once", backend, strings.Join(keys(crashed), ","), want)
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
