package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/term"
)

// demoConfig is `idem demo`'s configuration (its own single-dash flags).
type demoConfig struct {
	dir         string
	messages    int
	dupRate     float64 // messages published a second time past the broker's dedup window
	lostPubAcks float64 // relay batches whose publish ack is lost (the relay publishes them again)
	lostAcks    float64 // consumer acks lost on the way to the broker
	crashes     int     // consumer processes that die holding work
	consumers   int     // consumer processes running at once
	workers     int     // workers per consumer process
	keep        bool
	seed        uint64
	json        bool
	timeout     time.Duration
	removeDir   bool // dir is the run's temporary directory
}

func (c demoConfig) Validate() error {
	switch {
	case c.messages < 1 || c.messages > 10_000_000:
		return fmt.Errorf("-messages %d outside [1, 10000000]", c.messages)
	case c.dupRate < 0 || c.dupRate > 1:
		return fmt.Errorf("-dup %.2f outside [0, 1]", c.dupRate)
	case c.lostPubAcks < 0 || c.lostPubAcks > 0.5:
		return fmt.Errorf("-lost-publish-acks %.2f outside [0, 0.5]", c.lostPubAcks)
	case c.lostAcks < 0 || c.lostAcks > 0.5:
		return fmt.Errorf("-lost-acks %.2f outside [0, 0.5]", c.lostAcks)
	case c.consumers < 1 || c.consumers > 64:
		return fmt.Errorf("-consumers %d outside [1, 64]", c.consumers)
	case c.workers < 1 || c.workers > 1024:
		return fmt.Errorf("-workers %d outside [1, 1024]", c.workers)
	case c.crashes < 0 || c.crashes > 100:
		return fmt.Errorf("-crashes %d outside [0, 100]", c.crashes)
	case c.timeout < time.Second:
		return fmt.Errorf("-timeout %s: at least 1s", c.timeout)
	}
	return nil
}

// demoReport is the demo's outcome; --json prints it.
type demoReport struct {
	Messages            int     `json:"messages"`
	Deliveries          int64   `json:"deliveries"`
	DuplicatesDelivered int64   `json:"duplicates_delivered"`
	Effects             int64   `json:"effects"`
	DuplicateEffects    int64   `json:"duplicate_effects"`
	Lost                int64   `json:"lost"`
	MsgsPerSec          float64 `json:"msgs_per_sec"`
	P99Ms               float64 `json:"p99_ms"`
	// Beyond the fields above: what the faults hit and how the chain
	// absorbed them.
	P50Ms                float64 `json:"p50_ms"`
	EndToEndP99Ms        float64 `json:"end_to_end_p99_ms"`
	Replays              int64   `json:"replays"`
	DuplicatePublishes   int64   `json:"duplicate_publishes"`
	LostPublishAcks      int64   `json:"lost_publish_acks"` // relay batches
	LostAcks             int64   `json:"lost_acks"`
	Crashes              int     `json:"crashes"`
	AbandonedDeliveries  int64   `json:"abandoned_deliveries"`
	RerunsAfterCrash     int64   `json:"reruns_after_crash"`
	ReplayPhaseEffects   int64   `json:"replay_phase_effects"`
	ReplayPhaseDelivered int64   `json:"replay_phase_deliveries"`
	ElapsedSeconds       float64 `json:"elapsed_s"`
	ExactlyOnce          bool    `json:"exactly_once"`
	Error                string  `json:"error,omitempty"`
}

// demoTestFault, set by tests only, breaks the chain on purpose so that
// the demo's own check is shown to catch it: "duplicate-effect" applies
// one message's effect twice, "lost" drops one message's effect while
// reporting success.
var demoTestFault string

func demo(args []string, asJSON bool, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := demoConfig{json: asJSON}
	fs.StringVar(&c.dir, "dir", "", "directory of the run's files: broker store, app.db, idem.db (default: a new temporary directory, removed at exit)")
	fs.IntVar(&c.messages, "messages", 10000, "distinct messages to produce")
	fs.Float64Var(&c.dupRate, "dup", 0.2, "fraction of messages published a second time past the broker's dedup window")
	fs.Float64Var(&c.lostPubAcks, "lost-publish-acks", 0.02, "fraction of the relay's batches whose publish ack is lost (the relay publishes the batch again; the broker's dedup drops the copies)")
	fs.Float64Var(&c.lostAcks, "lost-acks", 0.02, "fraction of consumer acks lost (the broker redelivers after its ack wait)")
	fs.IntVar(&c.crashes, "crashes", 3, "consumer processes that die abruptly while holding deliveries (each replaced by a new one)")
	fs.IntVar(&c.consumers, "consumers", 3, "consumer processes running at once (one durable consumer group)")
	fs.IntVar(&c.workers, "workers", 16, "workers per consumer process")
	fs.BoolVar(&c.keep, "keep", false, "keep the run's files (with -dir, they are kept anyway)")
	fs.Uint64Var(&c.seed, "seed", uint64(time.Now().UnixNano()), "random seed of the faults")
	fs.BoolVar(&c.json, "json", asJSON, "print one JSON object instead of the table")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up (and report what is missing) after this long")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idem demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := c.Validate(); err != nil {
		fmt.Fprintln(stderr, "idem demo:", err)
		return 2
	}
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			fmt.Fprintln(stderr, "idem demo:", err)
			return 1
		}
		c.dir = dir
		c.removeDir = !c.keep
		if !c.keep {
			defer os.RemoveAll(dir)
		}
	} else if err := os.MkdirAll(c.dir, 0o700); err != nil {
		fmt.Fprintln(stderr, "idem demo:", err)
		return 1
	}
	var progress io.Writer
	if f, ok := stdout.(*os.File); ok && !c.json && term.IsTerminal(int(f.Fd())) {
		progress = stdout
	}
	text := stdout
	if c.json {
		text = io.Discard
	}
	rep, err := runDemo(c, text, progress)
	if err != nil {
		rep.Error = err.Error()
		if !c.json {
			fmt.Fprintln(stderr, "idem demo:", err)
		}
	}
	if c.json {
		b, _ := json.Marshal(rep)
		fmt.Fprintf(stdout, "%s\n", b)
	}
	if err != nil || !rep.ExactlyOnce {
		return 1
	}
	return 0
}

// printDemoHeader says what runs and which faults are injected.
func printDemoHeader(out io.Writer, c demoConfig) {
	fmt.Fprintf(out, "idem demo: %d messages: producer -> outbox (bbolt, in the order's transaction) -> relay -> NATS JetStream (embedded)\n", c.messages)
	fmt.Fprintf(out, "           -> %d consumer processes x %d workers -> guard (boltstore) -> effect (a ledger row in app.db)\n", c.consumers, c.workers)
	fmt.Fprintf(out, "faults: %.0f%% of messages published twice past the dedup window, %.0f%% of publish acks and %.0f%% of consumer acks lost, %d consumer crashes\n",
		c.dupRate*100, c.lostPubAcks*100, c.lostAcks*100, c.crashes)
	where := filepath.Clean(c.dir)
	if c.removeDir {
		where += " (removed at exit; -keep keeps it)"
	}
	fmt.Fprintf(out, "files: %s\n\n", where)
}
