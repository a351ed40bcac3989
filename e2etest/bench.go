package e2etest

import (
	"context"
	"errors"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// CPUTime is this process's user+system CPU time so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RunQueueWait is how long this process's threads have waited so far
// ready to run, for a core the kernel gave to another thread (the second
// field of Linux's /proc/self/task/*/schedstat, summed over the threads
// alive now); 0 where the kernel does not tell. Summed over threads, it
// can exceed the wall-clock time.
func RunQueueWait() time.Duration {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		sum += schedstatWait(string(b))
	}
	return sum
}

// schedstatWait is the run-queue wait of one schedstat line ("run wait
// slices", nanoseconds); 0 if the line is not one.
func schedstatWait(line string) time.Duration {
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return time.Duration(ns)
}

// BenchConsume times run, which must consume n messages into l, from a
// reset timer; it reports msgs/s, cpu-µs/msg (CPU of this process, user
// plus system: less sensitive to the machine's load than wall-clock
// throughput, and blind to PostgreSQL, another process) and runq-µs/msg
// (RunQueueWait per message: how long the process's threads were ready to
// run but waited for a core; when it is well above cpu-µs/msg, the wall
// clock measured the machine's other load more than this code) and then
// fails unless the ledger holds exactly n rows. With IDEM_BENCH_CPUPROFILE set
// to a file name, it writes the CPU profile of the timed part alone there
// (-test.cpuprofile also covers publishing and cleanup, which can take more
// CPU than the consume itself); the last variant run overwrites the others.
func BenchConsume(b *testing.B, l *Ledger, n int, run func()) {
	b.Helper()
	stop := startProfile(b)
	b.ResetTimer()
	start, cpu0, wait0 := time.Now(), CPUTime(), RunQueueWait()
	run()
	elapsed, cpu, wait := time.Since(start), CPUTime()-cpu0, RunQueueWait()-wait0
	b.StopTimer()
	stop()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/msg")
	b.ReportMetric(float64(wait.Microseconds())/float64(n), "runq-µs/msg")
	if total, _ := l.Counts(b); total != n {
		b.Fatalf("ledger has %d rows, want %d", total, n)
	}
}

// startProfile starts the CPU profile IDEM_BENCH_CPUPROFILE asks for, and
// returns what stops it.
func startProfile(b *testing.B) func() {
	name := os.Getenv("IDEM_BENCH_CPUPROFILE")
	if name == "" {
		return func() {}
	}
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatalf("%v (run without -test.cpuprofile)", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}

// RunBaseline is the no-guard side: workers goroutines each Fetch up to
// batchSize messages, apply insert to them and ack each, until n messages
// are done.
func RunBaseline(b *testing.B, sub broker.Subscriber, insert consumer.BatchHandler, n, workers, batchSize int) {
	var mu sync.Mutex
	done := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				msgs, err := sub.Fetch(ctx, batchSize)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
						b.Error(err)
					}
					return
				}
				if err := insert(ctx, msgs); err != nil {
					b.Error(err)
					return
				}
				for _, m := range msgs {
					_ = m.Acker.Ack(ctx)
				}
				mu.Lock()
				done += len(msgs)
				if done >= n {
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// Guarded is the guarded side of a consume benchmark.
type Guarded struct {
	Store      idem.Store
	Subscriber broker.Subscriber
	Insert     consumer.BatchHandler   // the batch effect, as RunBaseline's
	Tx         consumer.TxBatchHandler // if set, used instead of Insert
	N          int                     // messages to consume
	Workers    int
	BatchSize  int
}

// RunGuarded runs the consumer runtime in batch mode with a guard on
// g.Store until g.N messages were handled, then stops it (which drains:
// the last batches are completed and acked).
func RunGuarded(b *testing.B, g Guarded) {
	guard := NewGuard(b, g.Store)
	var (
		mu        sync.Mutex
		count     int
		batches   int
		inHandler time.Duration
		handled   = make(chan struct{})
	)
	cfg := consumer.Config{
		Subscriber:  g.Subscriber,
		Guard:       guard,
		Workers:     g.Workers,
		MaxInFlight: 2 * g.Workers * g.BatchSize,
		FetchBatch:  g.BatchSize,
		Batch:       consumer.BatchConfig{Size: g.BatchSize, Wait: 20 * time.Millisecond},
		Logger:      Quiet(),
	}
	if g.Tx != nil {
		cfg.TxBatchHandler = g.Tx
	} else {
		cfg.BatchHandler = func(ctx context.Context, msgs []*broker.Message) error {
			t0 := time.Now()
			if err := g.Insert(ctx, msgs); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			batches++
			inHandler += time.Since(t0)
			count += len(msgs)
			if count == g.N {
				close(handled)
			}
			return nil
		}
	}
	c, err := consumer.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	if g.Tx != nil {
		// The runtime calls a TxBatchHandler with the claims still to
		// make, so count what it handled instead.
		for c.Stats().Handled < int64(g.N) {
			select {
			case err := <-done:
				b.Fatalf("consumer stopped early: %v", err)
			case <-time.After(time.Millisecond):
			}
		}
	} else {
		select {
		case <-handled:
		case err := <-done:
			b.Fatalf("consumer stopped early: %v", err)
		}
		mu.Lock()
		b.Logf("%d batches, %.0f msgs avg, %s in the handler (summed over workers)", batches, float64(count)/float64(batches), inHandler)
		mu.Unlock()
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
