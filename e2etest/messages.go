package e2etest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
)

// Messages is how many messages an end-to-end test publishes: 10,000, or
// 100,000 when long is set (an adapter's -long flag); IDEM_E2E_MESSAGES
// overrides both.
func Messages(t testing.TB, long bool) int {
	if s := os.Getenv("IDEM_E2E_MESSAGES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("IDEM_E2E_MESSAGES=%q", s)
		}
		return n
	}
	if long {
		return 100_000
	}
	return 10_000
}

// ID is message i's id; the ledger checks rely on this exact form.
func ID(i int) string { return fmt.Sprintf("msg-%07d", i) }

// Payload is message i's payload: it names i, so a row carrying another
// message's payload is caught.
func Payload(i int) []byte { return fmt.Appendf(nil, `{"n":%d}`, i) }

// Message is message i on topic, with a traceparent header so tracing
// propagation is exercised on the way.
func Message(topic string, i int) *broker.Message {
	return &broker.Message{ID: ID(i), Topic: topic, Payload: Payload(i),
		Headers: map[string]string{broker.HeaderTraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
}

// BatchSize is how many originals Generate yields at a time.
const BatchSize = 1000

// Generate calls emit with messages from..to-1 in batches of BatchSize,
// each batch with the originals of the batch that dupFrac of them (chosen
// at random, seeded by from and to so a run is repeatable) repeat, to be
// published after it: duplicates interleave with later originals.
func Generate(topic string, from, to int, dupFrac float64, emit func(originals, dups []*broker.Message)) {
	rng := rand.New(rand.NewPCG(uint64(from), uint64(to)))
	var batch, dups []*broker.Message
	for i := from; i < to; i++ {
		m := Message(topic, i)
		batch = append(batch, m)
		if rng.Float64() < dupFrac {
			dups = append(dups, m)
		}
		if len(batch) == BatchSize {
			emit(batch, dups)
			batch, dups = nil, nil
		}
	}
	if len(batch) > 0 {
		emit(batch, dups)
	}
}

// Publish publishes messages from..to-1 through pub and dupFrac of them a
// second time through dupPub, a batch later (see Generate). dupPub is pub
// itself where the broker does not dedup by id, and a publisher with
// dedup off where it does, so the duplicates really reach the consumer
// (as after the dedup window).
func Publish(t testing.TB, pub, dupPub broker.Publisher, topic string, from, to int, dupFrac float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	send := func(p broker.Publisher, ms []*broker.Message) {
		if len(ms) == 0 {
			return
		}
		if err := p.Publish(ctx, ms...); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	Generate(topic, from, to, dupFrac, func(originals, dups []*broker.Message) {
		send(pub, originals)
		send(dupPub, dups)
	})
}
