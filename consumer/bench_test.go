package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/memstore"
)

// BenchmarkRuntime measures the runtime's own overhead on the in-memory
// broker and store, with a no-op effect: "raw" fetches and acks without a
// guard (the floor), "single" and "batch" run the consumer. cpu-µs/msg is
// the process's user+system CPU per message over the timed part (all
// goroutines, the runtime's included): on a shared machine it moves less
// than ns/op.
//
//	go test -run '^$' -bench Runtime -benchtime 200000x ./consumer
func BenchmarkRuntime(b *testing.B) {
	for _, mode := range []string{"raw", "single", "batch"} {
		b.Run(mode, func(b *testing.B) {
			mb, _ := membroker.New(membroker.Config{AckWait: time.Minute})
			pub := mb.NewPublisher()
			msgs := make([]*broker.Message, b.N)
			for i := range msgs {
				msgs[i] = &broker.Message{ID: fmt.Sprintf("m-%d", i), Topic: "t", Payload: []byte(`{"amount":10}`)}
			}
			if err := pub.Publish(context.Background(), msgs...); err != nil {
				b.Fatal(err)
			}
			sub := mb.NewSubscriber("t", "g")
			defer sub.Close()
			b.ResetTimer()
			start, cpu0 := time.Now(), consumer.CPUTime()
			if mode == "raw" {
				for done := 0; done < b.N; {
					ms, err := sub.Fetch(context.Background(), 256)
					if err != nil {
						b.Fatal(err)
					}
					for _, m := range ms {
						_ = m.Acker.Ack(context.Background())
					}
					done += len(ms)
				}
			} else {
				runConsumer(b, sub, mode == "batch")
			}
			elapsed, cpu := time.Since(start), consumer.CPUTime()-cpu0
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/msg")
		})
	}
}

func runConsumer(b *testing.B, sub broker.Subscriber, batch bool) {
	st, _ := memstore.New(memstore.Config{})
	defer st.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	g, _ := idem.NewGuard(st, idem.WithLogger(quiet))
	defer g.Close()
	cfg := consumer.Config{Subscriber: sub, Guard: g, Logger: quiet, MaxInFlight: 4096}
	if batch {
		cfg.Workers = 2
		cfg.BatchHandler = func(context.Context, []*broker.Message) error { return nil }
		cfg.Batch = consumer.BatchConfig{Size: 500, Wait: time.Millisecond}
	} else {
		cfg.Handler = func(context.Context, *broker.Message) ([]byte, error) { return nil, nil }
	}
	c, err := consumer.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for c.Stats().Handled < int64(b.N) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
