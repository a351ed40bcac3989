// Command idem-chaos is idem's fault harness: consumer and relay
// processes on one broker and one store, SIGKILLs, crash points, stalls,
// server restarts, proxy faults, partitions, outages, clock steps and
// poison messages, then a check that every message's effect happened
// exactly once. See docs/reliability.md.
//
//	go run ./chaos/cmd/idem-chaos -stores pg,redis -brokers nats -scenarios kill,stall -messages 5000
//	go run ./chaos/cmd/idem-chaos -cells stall/bolt/nats/batch50,kill/pg/kafka -batch 20
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idem-dev/idem/chaos"
)

func main() {
	chaos.MaybeWorker() // the harness re-executes this binary for its workers
	os.Exit(run())
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func run() int {
	var (
		cfg       chaos.Config
		scenarios = flag.String("scenarios", "", "comma-separated scenarios (default all): "+strings.Join(chaos.ScenarioNames(), ","))
		stores    = flag.String("stores", "", "comma-separated stores (default all): "+strings.Join(chaos.Stores, ","))
		brokers   = flag.String("brokers", "", "comma-separated brokers (default all): "+strings.Join(chaos.Brokers, ","))
		cells     = flag.String("cells", "", "explicit cells scenario/store/broker[/batchN], comma-separated (overrides the three above)")
		jsonOut   = flag.Bool("json", false, "print the results as JSON instead of a table")
		jsonFile  = flag.String("json-file", "", "also write the results as JSON to this file")
		timing    = flag.String("timing", "fast", "fast (3s lease, 5s ack wait, 3s session) or defaults (the library's and adapters' defaults)")
		list      = flag.Bool("list", false, "list the scenarios and exit")
		quiet     = flag.Bool("q", false, "no progress lines on stderr")
	)
	flag.IntVar(&cfg.Messages, "messages", 2000, "messages per cell")
	flag.DurationVar(&cfg.Duration, "duration", 20*time.Second, "fault loop per cell")
	flag.DurationVar(&cfg.Drain, "drain", 0, "longest wait for the backlog after healing (default derived from the timing)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed (default: from the clock; printed)")
	flag.IntVar(&cfg.Consumers, "consumers", 3, "consumer processes")
	flag.IntVar(&cfg.Relays, "relays", 2, "outbox relay processes")
	flag.IntVar(&cfg.Batch, "batch", 0, "consumers in batch mode with batches of up to this many messages (BatchHandler; TxBatchHandler on pg), for every cell without its own /batchN (0: one message at a time)")
	flag.IntVar(&cfg.Workers, "workers", 0, "handler concurrency of each consumer process (0: the consumer runtime's default, 16)")
	flag.IntVar(&cfg.MaxCrashes, "max-crashes", 6, "named-crash-point deaths per cell")
	flag.BoolVar(&cfg.Strict, "strict", false, "a fault that hit no in-flight work fails its cell (CI)")
	flag.BoolVar(&cfg.LateDuplicates, "late-duplicates", false, "as a store outage, partition or restart ends, publish again the messages whose completion went unrecorded during it (catches a process claiming its own held keys again, or acking an unrecorded completion silently)")
	flag.BoolVar(&cfg.NoNetNS, "no-netns", false, "run workers in the host's network namespace (the partition scenario then fails)")
	flag.StringVar(&cfg.Dir, "dir", "", "directory for servers' data and workers' logs (default: temporary, removed after a passing run)")
	flag.DurationVar(&cfg.ProgressEvery, "progress", 0, "log each cell's committed messages, ledger rows and rate this often (0: never)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the directory after a passing run")
	flag.Parse()
	if *list {
		for _, s := range chaos.Scenarios() {
			fmt.Printf("%-22s %-28s %s\n", s.Name, strings.Join(s.Covers, ","), s.Doc)
		}
		return 0
	}
	cfg.Scenarios, cfg.Stores, cfg.Brokers = split(*scenarios), split(*stores), split(*brokers)
	for _, s := range split(*cells) {
		c, err := chaos.ParseCell(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if c.Batch == 0 {
			c.Batch = cfg.Batch
		}
		cfg.Cells = append(cfg.Cells, c)
	}
	switch *timing {
	case "fast":
		cfg.Timing = chaos.Fast()
	case "defaults":
		cfg.Timing = chaos.Defaults()
	default:
		fmt.Fprintf(os.Stderr, "bad -timing %q\n", *timing)
		return 2
	}
	if !*quiet {
		cfg.Progress = os.Stderr
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := chaos.Run(ctx, cfg)
	if *jsonOut {
		_ = chaos.WriteJSON(os.Stdout, res)
	} else {
		_ = chaos.WriteTable(os.Stdout, res)
	}
	if *jsonFile != "" {
		f, ferr := os.Create(*jsonFile)
		if ferr == nil {
			ferr = chaos.WriteJSON(f, res)
			if cerr := f.Close(); ferr == nil {
				ferr = cerr
			}
		}
		if ferr != nil {
			fmt.Fprintln(os.Stderr, "idem-chaos:", ferr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-chaos:", err)
		return 1
	}
	for _, r := range res {
		if !r.Pass {
			return 1
		}
	}
	return 0
}
