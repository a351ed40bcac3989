package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
)

type demoConfig struct {
	db       string
	messages int
	dupRate  float64
	crashes  int
	workers  int
	keep     bool
	seed     uint64
}

func (c demoConfig) Validate() error {
	switch {
	case c.messages < 1 || c.messages > 10_000_000:
		return fmt.Errorf("-messages %d outside [1, 10000000]", c.messages)
	case c.dupRate < 0 || c.dupRate > 5:
		return fmt.Errorf("-dup %.2f outside [0, 5]", c.dupRate)
	case c.workers < 1 || c.workers > 1024:
		return fmt.Errorf("-workers %d outside [1, 1024]", c.workers)
	case c.crashes < 0 || c.crashes > c.messages:
		return fmt.Errorf("-crashes %d outside [0, messages]", c.crashes)
	}
	return nil
}

// delivery is one (re)delivery of a message by the simulated broker.
type delivery struct {
	id    string
	crash bool // the worker dies after claiming, before the effect
}

type counters struct {
	deliveries, effects, replays, inProgress, crashed, retried atomic.Int64
}

func demo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c demoConfig
	fs.StringVar(&c.db, "db", "", "store file (default: a new file in a temporary directory, removed at exit)")
	fs.IntVar(&c.messages, "messages", 10000, "distinct messages to publish")
	fs.Float64Var(&c.dupRate, "dup", 0.2, "extra deliveries per message (0.2 = 20% duplicates)")
	fs.IntVar(&c.crashes, "crashes", 50, "deliveries whose worker dies after claiming (lease expiry, takeover)")
	fs.IntVar(&c.workers, "workers", 64, "concurrent consumer workers")
	fs.BoolVar(&c.keep, "keep", false, "keep the store and ledger files")
	fs.Uint64Var(&c.seed, "seed", uint64(time.Now().UnixNano()), "random seed")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := c.Validate(); err != nil {
		fmt.Fprintln(stderr, "idem demo:", err)
		return 2
	}
	dir := filepath.Dir(c.db)
	if c.db == "" {
		var err error
		if dir, err = os.MkdirTemp("", "idem-demo-"); err != nil {
			fmt.Fprintln(stderr, "idem demo:", err)
			return 1
		}
		c.db = filepath.Join(dir, "idem.db")
		if !c.keep {
			defer os.RemoveAll(dir)
		}
	}
	if err := runDemo(c, filepath.Join(dir, "ledger.txt"), stdout); err != nil {
		fmt.Fprintln(stderr, "idem demo:", err)
		return 1
	}
	return 0
}

func runDemo(c demoConfig, ledgerPath string, out io.Writer) error {
	rng := rand.New(rand.NewPCG(c.seed, 7))
	// The broker: every message once, plus duplicates (producer retries,
	// redeliveries after lost acks), shuffled, plus crashed deliveries whose
	// redelivery comes later.
	var ds []delivery
	for i := 0; i < c.messages; i++ {
		ds = append(ds, delivery{id: fmt.Sprintf("order-%07d:charge", i)})
	}
	for n := int(float64(c.messages) * c.dupRate); n > 0; n-- {
		ds = append(ds, delivery{id: ds[rng.IntN(c.messages)].id})
	}
	rng.Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
	for i := 0; i < c.crashes; i++ {
		ds[rng.IntN(len(ds))].crash = true
	}

	ledger, err := os.OpenFile(ledgerPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer ledger.Close()
	var ledgerMu sync.Mutex
	// The effect: append a line to a ledger that has no uniqueness of its
	// own. Only the guard keeps it exact.
	effect := func(id string, token uint64) error {
		ledgerMu.Lock()
		defer ledgerMu.Unlock()
		_, err := fmt.Fprintf(ledger, "%s token=%d\n", id, token)
		return err
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fmt.Fprintf(out, "idem demo: %d messages, %d deliveries (%.0f%% duplicates, %d crashed workers), %d workers\nstore: %s (embedded, fsync on commit)\n\n",
		c.messages, len(ds), c.dupRate*100, c.crashes, c.workers, c.db)

	var total counters
	for phase, name := range []string{"first run", "after restart: broker redelivers everything"} {
		store, err := boltstore.Open(boltstore.Config{Path: c.db, Logger: quiet})
		if err != nil {
			return err
		}
		const lease = 200 * time.Millisecond
		guard, err := idem.NewGuard(store, idem.WithLease(lease), idem.WithTTL(72*time.Hour), idem.WithLogger(quiet))
		if err != nil {
			store.Close()
			return err
		}
		// Workers that crash are simulated with a guard without heartbeat:
		// a dead process no longer extends its lease.
		dead, err := idem.NewGuard(store, idem.WithLease(lease), idem.WithHeartbeat(-1), idem.WithLogger(quiet))
		if err != nil {
			store.Close()
			return err
		}
		var pc counters
		start := time.Now()
		deliver(guard, dead, ds, phase == 0, c.workers, lease, effect, &pc)
		elapsed := time.Since(start)
		guard.Close()
		if err := store.Close(); err != nil {
			return err
		}
		fmt.Fprintf(out, "%-45s %8d deliveries  %8d effects  %8d replays  %6d in-progress retries  %5d crashes  %6.0f deliveries/s\n",
			name, pc.deliveries.Load(), pc.effects.Load(), pc.replays.Load(), pc.inProgress.Load(), pc.crashed.Load(),
			float64(pc.deliveries.Load())/elapsed.Seconds())
		total.effects.Add(pc.effects.Load())
	}

	if err := ledger.Sync(); err != nil {
		return err
	}
	counts, lines, err := countLedger(ledgerPath)
	if err != nil {
		return err
	}
	missing, doubled := 0, 0
	for i := 0; i < c.messages; i++ {
		switch n := counts[fmt.Sprintf("order-%07d:charge", i)]; {
		case n == 0:
			missing++
		case n > 1:
			doubled++
		}
	}
	fmt.Fprintf(out, "\nledger: %d lines for %d messages: %d missing, %d applied more than once\n", lines, c.messages, missing, doubled)
	if missing > 0 || doubled > 0 || lines != c.messages {
		return errors.New("exactly-once violated")
	}
	fmt.Fprintln(out, "every message's effect happened exactly once")
	return nil
}

// deliver plays the broker's deliveries through the guard with n workers.
// A delivery the guard answers "in progress" is redelivered later, as a
// broker does after a nak with delay; a crashed delivery's redelivery waits
// for the dead worker's lease to run out.
func deliver(g, dead *idem.Guard, ds []delivery, crashes bool, workers int, lease time.Duration, effect func(string, uint64) error, pc *counters) {
	queue := make(chan delivery, len(ds)+workers)
	var pending sync.WaitGroup
	pending.Add(len(ds))
	for _, d := range ds {
		if !crashes {
			d.crash = false
		}
		queue <- d
	}
	go func() { pending.Wait(); close(queue) }()
	var wg sync.WaitGroup
	ctx := context.Background()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range queue {
				pc.deliveries.Add(1)
				if d.crash {
					// Claim and die: no heartbeat, no settle, no ack.
					if h, _, err := dead.Acquire(ctx, []byte(d.id)); err == nil && h != nil {
						pc.crashed.Add(1)
						d.crash = false
						time.AfterFunc(lease, func() { queue <- d }) // the broker redelivers after its ack wait
						continue
					}
				}
				res, err := g.Do(ctx, []byte(d.id), func(ctx context.Context) ([]byte, error) {
					tok, _ := idem.TokenFromContext(ctx)
					return nil, effect(d.id, tok)
				})
				switch {
				case errors.Is(err, idem.ErrInProgress):
					pc.inProgress.Add(1)
					var ip *idem.InProgressError
					errors.As(err, &ip)
					time.AfterFunc(min(ip.RetryAfter(time.Now()), lease), func() { queue <- d })
					continue
				case err != nil:
					pc.retried.Add(1)
					time.AfterFunc(10*time.Millisecond, func() { queue <- d })
					continue
				case res.Replayed:
					pc.replays.Add(1)
				default:
					pc.effects.Add(1)
				}
				pending.Done() // acked
			}
		}()
	}
	wg.Wait()
}

func countLedger(path string) (map[string]int, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	counts := map[string]int{}
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var id string
		var tok uint64
		if _, err := fmt.Sscanf(sc.Text(), "%s token=%d", &id, &tok); err != nil {
			return nil, 0, fmt.Errorf("ledger line %d: %w", lines+1, err)
		}
		counts[id]++
		lines++
	}
	return counts, lines, sc.Err()
}
