package watermillidem_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idem-dev/idem/watermillidem"
)

// TestSideBySide runs Watermill's own middleware.Deduplicator (its
// defaults: Adler-32 of the payload, an in-memory map per process, one
// minute) and this middleware through the same router on the same inputs,
// and checks what each does (docs/watermill.md has the table). GoChannel
// with BlockPublishUntilSubscriberAck: a Publish returns once the message
// was acked, after as many nack-redeliveries as it took.
func TestSideBySide(t *testing.T) {
	type input struct{ uuid, payload string }
	scenarios := []struct {
		name string
		// instances: how many processes consume (each its own router and,
		// for Watermill, its own in-memory repository); inputs go to them
		// in turn.
		instances int
		inputs    []input
		failOnce  bool // the handler fails on each message's first run
		// effects wanted (handler successes), per kind
		watermill, idem int
		idemDLQ         int // messages idem dead-letters
	}{
		{"duplicate publish of one message", 1, []input{{"a", "p"}, {"a", "p"}}, false, 1, 1, 0},
		{"two messages with the same payload", 1, []input{{"a", "same"}, {"b", "same"}}, false, 1, 2, 0},
		{"handler fails once, redelivered", 1, []input{{"a", "p"}}, true, 0, 1, 0},
		{"redelivery to another process", 2, []input{{"a", "p"}, {"a", "p"}}, false, 2, 1, 0},
		{"one UUID, another payload", 1, []input{{"a", "p1"}, {"a", "p2"}}, false, 2, 1, 1},
	}
	for _, sc := range scenarios {
		for _, kind := range []string{"watermill", "idem"} {
			t.Run(sc.name+"/"+kind, func(t *testing.T) {
				store := newStore(t) // shared by every idem instance
				guard := newGuard(t, store)
				dlq := goChannel(t)
				dead, err := dlq.Subscribe(t.Context(), "dlq")
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				seen := map[string]bool{}
				succeeded := 0
				var pubs []message.Publisher
				for range sc.instances {
					ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
					t.Cleanup(func() { ps.Close() })
					var mw message.HandlerMiddleware
					if kind == "watermill" {
						mw = (&middleware.Deduplicator{}).Middleware
					} else {
						mw = newDedup(t, watermillidem.Config{Guard: guard, DeadLetter: dlq, DeadLetterTopic: "dlq"}).Middleware
					}
					runRouter(t, ps, "in", []message.HandlerMiddleware{mw}, func(m *message.Message) error {
						mu.Lock()
						defer mu.Unlock()
						first := !seen[m.UUID+string(m.Payload)]
						seen[m.UUID+string(m.Payload)] = true
						if sc.failOnce && first {
							return errors.New("transient handler failure")
						}
						succeeded++
						return nil
					})
					pubs = append(pubs, ps)
				}
				for i, in := range sc.inputs {
					if err := pubs[i%len(pubs)].Publish("in", message.NewMessage(in.uuid, []byte(in.payload))); err != nil {
						t.Fatal(err)
					}
				}
				want := sc.watermill
				if kind == "idem" {
					want = sc.idem
				}
				mu.Lock()
				got := succeeded
				mu.Unlock()
				if got != want {
					t.Fatalf("%d effects, want %d", got, want)
				}
				if kind == "idem" {
					for range sc.idemDLQ {
						m := <-dead
						m.Ack()
						if m.Metadata.Get(watermillidem.MetadataOriginalUUID) == "" || m.Metadata.Get(middleware.ReasonForPoisonedKey) == "" {
							t.Fatalf("dead letter without its metadata: %v", m.Metadata)
						}
					}
				}
			})
		}
	}
}
