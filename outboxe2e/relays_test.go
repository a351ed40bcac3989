package outboxe2e

import (
	"sync"
	"testing"

	"github.com/idem-dev/idem/e2etest"
)

// TestTwoRelayProcesses: two relay processes drain one outbox while four
// producers commit 1,000 messages: each message is published by exactly
// one process, once, and the stream (dedup off, so a second publish would
// be stored) holds exactly the 1,000.
func TestTwoRelayProcesses(t *testing.T) {
	for _, backend := range []string{"postgres", "mariadb"} {
		t.Run(backend, func(t *testing.T) {
			const n = 1000
			ledger := e2etest.NewLedger(t, "oe2e_relays")
			_, js := connectJS(t, natsURL())
			stream := newStream(t, js)
			topic := stream + ".orders"
			b := newBox(t, backend, ledger)
			env := append(b.env, envNATS+"="+natsURL(), envNoDedup+"=1", envBatch+"=10")
			relays := []*child{startRelay(t, env...), startRelay(t, env...)}
			var wg sync.WaitGroup
			for p := range 4 {
				wg.Go(func() { enqueueRange(t, b, topic, p*n/4, (p+1)*n/4, 5) })
			}
			wg.Wait()
			waitDrained(t, b.backend)
			total := map[string]int{}
			for i, r := range relays {
				r.stop(t)
				got := r.published()
				if len(got) == 0 {
					t.Fatalf("relay process %d published nothing: the test did not run two at once", i)
				}
				for id, c := range got {
					total[id] += c
				}
				t.Logf("relay process %d published %d messages", i, len(got))
			}
			for i := range n {
				if id := e2etest.ID(i); total[id] != 1 {
					t.Fatalf("message %s published %d times, want once", id, total[id])
				}
			}
			if len(total) != n {
				t.Fatalf("%d distinct messages published, want %d", len(total), n)
			}
			if got := streamCount(t, js, stream); got != n {
				t.Fatalf("stream holds %d messages, want %d", got, n)
			}
		})
	}
}
