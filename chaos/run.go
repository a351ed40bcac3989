package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem/chaos/internal/netns"
)

// Stores and Brokers the harness runs on.
var (
	Stores  = []string{"bolt", "pg", "redis", "mysql"}
	Brokers = []string{"nats", "kafka", "streams", "rabbit"}
)

// Cell is one scenario on one store and one broker.
type Cell struct {
	Scenario string `json:"scenario"`
	Store    string `json:"store"`
	Broker   string `json:"broker"`
	// Batch is the consumers' batch size: 0 runs them one message at a
	// time (consumer.Config.Handler); n > 0 in batch mode
	// (consumer.BatchConfig.Size n): a BatchHandler whose effects commit
	// in one ledger transaction per batch, or, on PostgreSQL, a
	// TxBatchHandler (pgstore.TxBatchHandler) that claims, applies and
	// completes the batch in one transaction.
	Batch int `json:"batch,omitempty"`
}

// String is scenario/store/broker, with /batchN in batch mode.
func (c Cell) String() string {
	s := c.Scenario + "/" + c.Store + "/" + c.Broker
	if c.Batch > 0 {
		s += fmt.Sprintf("/batch%d", c.Batch)
	}
	return s
}

// ParseCell reads a Cell as String writes it: scenario/store/broker, or
// scenario/store/broker/batchN. The names are not checked (Validate does).
func ParseCell(s string) (Cell, error) {
	p := strings.Split(s, "/")
	if len(p) != 3 && len(p) != 4 {
		return Cell{}, fmt.Errorf("bad cell %q: want scenario/store/broker or scenario/store/broker/batchN", s)
	}
	c := Cell{Scenario: p[0], Store: p[1], Broker: p[2]}
	if len(p) == 4 {
		n, err := strconv.Atoi(strings.TrimPrefix(p[3], "batch"))
		if err != nil || !strings.HasPrefix(p[3], "batch") || n <= 0 {
			return Cell{}, fmt.Errorf("bad cell %q: the fourth part is batchN, N > 0", s)
		}
		c.Batch = n
	}
	return c, nil
}

// MaxBatch bounds Cell.Batch.
const MaxBatch = 1000

// NeedsNetNS reports whether the cell's scenario cuts the workers'
// network off (partition, and mixed, which includes it): a run with such a
// cell puts its workers in a network namespace, one per process, so two
// such runs cannot go on in one process at the same time.
func (c Cell) NeedsNetNS() bool { return c.Scenario == "partition" || c.Scenario == "mixed" }

// Config is a run.
type Config struct {
	// Cells to run, in order. Empty: every scenario of Scenarios on every
	// store of Stores and broker of Brokers.
	Cells     []Cell
	Scenarios []string
	Stores    []string
	Brokers   []string
	// Batch is Cell.Batch of the cells made from Scenarios, Stores and
	// Brokers (Cells keep their own).
	Batch int

	Messages  int           // originals published per cell (default 2000)
	Duration  time.Duration // the fault loop of each cell (default 20s)
	Drain     time.Duration // longest wait for the backlog to drain after healing (default: derived from Timing)
	Seed      uint64        // default: from the clock (printed, so a run can be repeated)
	Consumers int           // consumer processes (default 3)
	Relays    int           // outbox relay processes (default 2)
	// Workers is each consumer process's handler concurrency (default:
	// the consumer runtime's, 16).
	Workers int
	// MaxCrashes bounds the named-crash-point deaths per cell (default 6).
	MaxCrashes int
	// DupFraction of the originals are published a second time
	// (default 0.2; negative: none).
	DupFraction float64
	Timing      Timing
	// Strict (CI): a fault that hit no in-flight work fails its cell.
	Strict bool
	// LateDuplicates: as a store outage or partition ends (a store
	// restart, once the store is up), publish again every message whose
	// completion went unrecorded during it, and hold the fault a
	// store-down delay and a half longer (see cell.lateDuplicates).
	LateDuplicates bool
	// NoNetNS runs the workers in the host's network namespace (the
	// partition scenario then fails: it needs one).
	NoNetNS bool
	// Dir holds the servers' data and the workers' logs (default: a new
	// temporary directory, removed after a run that passed unless Keep).
	Dir  string
	Keep bool
	// Progress receives a line per phase (nil: none).
	Progress io.Writer
	// ProgressEvery paces a cell's progress lines (committed, effects in
	// the ledger, rate) while it runs (0: none).
	ProgressEvery time.Duration
	// WorkerBinary is the program started for consumers, relays and the
	// store server, with IDEM_CHAOS_ROLE set (it must call MaybeWorker
	// first). Default: this process's own executable.
	WorkerBinary string
}

func (c Config) withDefaults() Config {
	if c.Messages == 0 {
		c.Messages = 2000
	}
	if c.Duration == 0 {
		c.Duration = 20 * time.Second
	}
	if c.Consumers == 0 {
		c.Consumers = 3
	}
	if c.Relays == 0 {
		c.Relays = 2
	}
	if c.MaxCrashes == 0 {
		c.MaxCrashes = 6
	}
	if c.DupFraction == 0 {
		c.DupFraction = 0.2
	}
	if c.DupFraction < 0 {
		c.DupFraction = 0
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.WorkerBinary == "" {
		c.WorkerBinary, _ = os.Executable()
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = ScenarioNames()
	}
	if len(c.Stores) == 0 {
		c.Stores = Stores
	}
	if len(c.Brokers) == 0 {
		c.Brokers = Brokers
	}
	if len(c.Cells) == 0 {
		for _, sc := range c.Scenarios {
			for _, st := range c.Stores {
				for _, br := range c.Brokers {
					c.Cells = append(c.Cells, Cell{Scenario: sc, Store: st, Broker: br, Batch: c.Batch})
				}
			}
		}
	}
	return c
}

// Validate reports a configuration Run would refuse.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	for _, cl := range c.Cells {
		if _, ok := scenarioByName(cl.Scenario); !ok {
			errs = append(errs, fmt.Errorf("unknown scenario %q (have %s)", cl.Scenario, strings.Join(ScenarioNames(), ", ")))
		}
		if !slices.Contains(Stores, cl.Store) {
			errs = append(errs, fmt.Errorf("unknown store %q (have %s)", cl.Store, strings.Join(Stores, ", ")))
		}
		if !slices.Contains(Brokers, cl.Broker) {
			errs = append(errs, fmt.Errorf("unknown broker %q (have %s)", cl.Broker, strings.Join(Brokers, ", ")))
		}
		if cl.Batch < 0 || cl.Batch > MaxBatch {
			errs = append(errs, fmt.Errorf("cell %s: batch %d outside [0, %d]", cl, cl.Batch, MaxBatch))
		}
	}
	if c.Messages < 100 || c.Messages > 9_999_999 {
		errs = append(errs, fmt.Errorf("messages %d outside [100, 9999999]", c.Messages))
	}
	if c.Duration < time.Second {
		errs = append(errs, fmt.Errorf("duration %s < 1s", c.Duration))
	}
	if c.Consumers < 2 || c.Consumers > 16 || c.Relays < 1 || c.Relays > 8 {
		errs = append(errs, errors.New("consumers must be in [2, 16] and relays in [1, 8]"))
	}
	if c.Workers < 0 || c.Workers > 256 {
		errs = append(errs, fmt.Errorf("workers %d outside [0, 256]", c.Workers))
	}
	if c.DupFraction > 1 {
		errs = append(errs, errors.New("dup fraction > 1"))
	}
	return errors.Join(errs...)
}

// Run runs every cell of cfg and returns their results, in order. The
// error is for a run that could not be carried out (a server would not
// start); a cell that found a duplicate or a loss is a Result with Pass
// false.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "idem-chaos-")
		if err != nil {
			return nil, err
		}
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	_ = os.Chmod(dir, 0o755) // servers run as other users
	r := &runner{cfg: cfg, dir: dir, rng: rand.New(rand.NewPCG(cfg.Seed, 0x1de5))}
	r.logf("seed %d, dir %s, %d cells", cfg.Seed, dir, len(cfg.Cells))
	needNS := false
	for _, cl := range cfg.Cells {
		needNS = needNS || cl.NeedsNetNS()
	}
	useNS := needNS && !cfg.NoNetNS
	if useNS {
		if err := netns.Available(); err != nil {
			r.logf("no network namespace (%v): workers run in the host's; the partition scenario will fail", err)
			useNS = false
		}
	}
	e, err := newEnv(dir, useNS)
	if err != nil {
		return nil, err
	}
	r.env = e
	defer e.close()
	var results []Result
	pass := true
	for i, cl := range cfg.Cells {
		if ctx.Err() != nil {
			break
		}
		res := r.runCell(ctx, i, cl)
		results = append(results, res)
		pass = pass && res.Pass
		r.logf("%s", res.Line())
	}
	if pass && !cfg.Keep && cfg.Dir == "" {
		e.close()
		_ = os.RemoveAll(dir)
	}
	return results, ctx.Err()
}

type runner struct {
	cfg Config
	dir string
	env *env

	mu  sync.Mutex
	rng *rand.Rand
}

func (r *runner) logf(format string, a ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
	}
}

// seedFor is a cell's own seed: the run's seed and the cell's index, so
// one cell can be re-run alone with the same faults.
func (r *runner) seedFor(i int) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.Seed ^ (uint64(i+1) * 0x9e3779b97f4a7c15)
}
