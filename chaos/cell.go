package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/chaos/internal/servers"
	"github.com/idem-dev/idem/chaos/internal/shm"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// restartable is a server a fault can crash and start again.
type restartable interface {
	Crash() error
	Start(ctx context.Context) error
}

// cell runs one scenario on one store and one broker.
type cell struct {
	r *runner
	Cell
	idx  int
	sc   *Scenario
	name string // schema, stream, topic and key prefix
	dir  string

	rmu sync.Mutex
	rng *rand.Rand

	spec       Spec
	ledger     *pgxpool.Pool // the harness's pool on the ledger database
	admin      *brokerAdmin
	proxy      *storeProxy
	storeSrv   restartable
	brokerSrv  restartable
	storeAddr  string          // the store server's own address (for the checks)
	boltSrv    *servers.Server // bolt: this cell's store server
	consumers  []*worker
	relays     []*worker
	poison     int
	dupFrac    float64
	crashes    atomic.Int64
	healed     atomic.Bool // the fault loop is over: no more crash points armed
	requeued   atomic.Int64
	produced   atomic.Int64
	published  atomic.Int64 // duplicate publishes
	start      time.Time
	loopEnd    time.Time
	drainedAt  time.Time
	drainState string

	fmu      sync.Mutex
	faults   []Fault
	problems []string
	// faultPids: processes a fault made lose their claims (killed,
	// crashed, stalled), with when: an effect re-run after one of them
	// is expected (the handler's fence absorbs it); any other is not.
	faultPids map[int]string
}

func (c *cell) rnd() *rand.Rand { return c.rng }

// intn is a seeded random int in [lo, hi].
func (c *cell) intn(lo, hi int) int {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if hi <= lo {
		return lo
	}
	return lo + c.rng.IntN(hi-lo+1)
}

// between is a seeded random duration in [lo, hi].
func (c *cell) between(lo, hi time.Duration) time.Duration {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)))
}

func (c *cell) logf(format string, a ...any) {
	c.r.logf("[%s] %s", c.name, fmt.Sprintf(format, a...))
}

func (c *cell) problem(format string, a ...any) {
	p := fmt.Sprintf(format, a...)
	c.fmu.Lock()
	c.problems = append(c.problems, p)
	c.fmu.Unlock()
	c.logf("PROBLEM: %s", p)
}

func (c *cell) addFault(f Fault) {
	f.At = time.Since(c.start).Round(time.Millisecond)
	c.fmu.Lock()
	c.faults = append(c.faults, f)
	c.fmu.Unlock()
	hit := "hit"
	if !f.Hit {
		hit = "HIT NOTHING"
	}
	c.logf("fault %s on %s: %s (%s)", f.Kind, f.Target, hit, f.Evidence)
}

func (c *cell) markPid(pid int, why string) {
	c.fmu.Lock()
	c.faultPids[pid] = why
	c.fmu.Unlock()
}

func (r *runner) runCell(ctx context.Context, i int, cl Cell) Result {
	sc, _ := scenarioByName(cl.Scenario)
	name := fmt.Sprintf("c%02d_%s_%s_%s", i, strings.ReplaceAll(cl.Scenario, "-", "_"), cl.Store, cl.Broker)
	if cl.Batch > 0 {
		name += fmt.Sprintf("_b%d", cl.Batch)
	}
	c := &cell{r: r, Cell: cl, idx: i, sc: sc, name: name, dir: filepath.Join(r.dir, name),
		rng: rand.New(rand.NewPCG(r.seedFor(i), 7)), poison: 500, dupFrac: r.cfg.DupFraction, faultPids: map[int]string{}}
	if sc.Poison > 0 {
		c.poison = sc.Poison
	}
	res := Result{Cell: cl, Seed: r.seedFor(i)}
	t0 := time.Now()
	defer c.teardown()
	if err := c.setup(ctx); err != nil {
		res.Problems = append(res.Problems, "setup: "+err.Error())
		return res
	}
	c.logf("set up in %s; %d messages, poison 1/%d, %d%% published twice", time.Since(t0).Round(time.Millisecond),
		r.cfg.Messages, c.poison, int(c.dupFrac*100))
	if err := c.startWorkers(); err != nil {
		res.Problems = append(res.Problems, "workers: "+err.Error())
		return res
	}
	c.start = time.Now()
	superCtx, stopSuper := context.WithCancel(ctx)
	superDone := make(chan struct{})
	go func() { defer close(superDone); c.supervise(superCtx) }()
	prodDone := make(chan error, 1)
	go func() { prodDone <- c.produce(ctx) }()
	go c.progress(superCtx)

	// Faults start once the consumers receive messages (a Kafka group
	// takes a few seconds to form), so the first one meets work.
	if !waitFor(ctx, time.Minute, func() bool { return c.live()[shm.Fetched] > 0 }) {
		c.problem("the consumers received nothing for a minute")
	}
	loopCtx, stopLoop := context.WithTimeout(ctx, r.cfg.Duration)
	c.loopEnd = time.Now().Add(r.cfg.Duration)
	sc.run(loopCtx, c)
	stopLoop()
	c.heal(ctx)
	c.logf("fault loop over after %s; healed", time.Since(c.start).Round(time.Millisecond))
	if err := <-prodDone; err != nil {
		c.problem("producer: %v", err)
	}
	c.drain(ctx)
	stopSuper()
	<-superDone
	t1 := time.Now()
	c.stopWorkers()
	t2 := time.Now()
	res = c.check(ctx, res)
	c.logf("workers stopped in %s, checked in %s", t2.Sub(t1).Round(time.Millisecond), time.Since(t2).Round(time.Millisecond))
	return res
}

func (c *cell) setup(ctx context.Context) error {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	e := c.r.env
	pgSrv, ledger, err := e.postgres(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	c.ledger = ledger
	if _, err := ledger.Exec(ctx, ledgerDDL(c.name)+`; CREATE INDEX ON `+c.name+`.ledger (msg_id)`); err != nil {
		return err
	}
	if err := pgoutbox.Migrate(ctx, pgoutbox.Config{Pool: ledger, Schema: c.name, Table: "outbox"}); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	c.spec = Spec{
		Cell:      c.name,
		LedgerURL: pgURL(e.pgAddr(), ledgerDB),
		Schema:    c.name,
		Effect:    EffectFenced,
		Timing:    c.r.cfg.Timing,
		Poison:    c.poison,
		Workers:   c.r.cfg.Workers,
		Batch:     c.Batch,
		Store:     StoreSpec{Kind: c.Store, Name: c.name, DBName: ledgerDB},
	}
	// The broker.
	bs := BrokerSpec{Kind: c.Broker, Group: "consumers"}
	switch c.Broker {
	case "nats":
		s, err := e.natsServer(ctx)
		if err != nil {
			return fmt.Errorf("nats-server: %w", err)
		}
		c.brokerSrv = s
		bs.URL = "nats://" + s.Addr()
		bs.Stream = strings.ToUpper(c.name)
		bs.Topic, bs.DLQ = "chaos."+c.name+".in", "chaos."+c.name+".dlq"
	case "streams":
		s, err := e.streamsServer(ctx)
		if err != nil {
			return fmt.Errorf("redis-server (streams): %w", err)
		}
		c.brokerSrv = s
		bs.URL = s.Addr()
		bs.Topic, bs.DLQ = "chaos."+c.name+".in", "chaos."+c.name+".dlq"
	case "rabbit":
		s, err := e.rabbitNode(ctx)
		if err != nil {
			return fmt.Errorf("rabbitmq-server: %w", err)
		}
		c.brokerSrv = s
		bs.URL = "amqp://guest:guest@" + s.Addr() + "/"
		bs.Group = "chaos." + c.name + ".work" // queues are per node: one per cell
		bs.Topic, bs.DLQ = "chaos."+c.name+".in", "chaos."+c.name+".dlq"
	case "kafka":
		k, err := e.kafkaCluster()
		if err != nil {
			return err
		}
		c.brokerSrv = k
		bs.Brokers = []string{k.Addr()}
		bs.Topic, bs.DLQ = c.name+".in", c.name+".dlq"
	}
	c.spec.Broker = bs
	c.admin, err = newBrokerAdmin(ctx, bs)
	if err != nil {
		return err
	}
	if err := c.admin.setup(ctx); err != nil {
		return fmt.Errorf("broker setup: %w", err)
	}
	// The store.
	switch c.Store {
	case "pg":
		c.storeSrv, c.storeAddr = pgSrv, pgSrv.Addr()
		c.spec.Effect = EffectTx
	case "redis":
		s, err := e.redisServer(ctx)
		if err != nil {
			return fmt.Errorf("redis-server: %w", err)
		}
		c.storeSrv, c.storeAddr = s, s.Addr()
	case "mysql":
		s, err := e.mariadb(ctx)
		if err != nil {
			return fmt.Errorf("mariadb: %w", err)
		}
		c.storeSrv, c.storeAddr = s, s.Addr()
	case "bolt":
		spec := c.spec
		spec.Role, spec.Store.Path = RoleStore, filepath.Join(c.dir, "idem.db")
		js, err := jsonSpec(spec)
		if err != nil {
			return err
		}
		s, err := servers.StartChild(ctx, c.r.cfg.WorkerBinary, "store-server", filepath.Join(c.dir, "store"), "127.0.0.1",
			[]string{EnvRole + "=" + RoleStore, EnvSpec + "=" + js})
		if err != nil {
			return fmt.Errorf("store server: %w", err)
		}
		c.boltSrv, c.storeSrv, c.storeAddr = s, s, s.Addr()
	}
	if err := migrateStore(ctx, c.spec, c.storeAddr); err != nil {
		return fmt.Errorf("store migrate: %w", err)
	}
	c.proxy, err = newStoreProxy(c.name, e.storeHost, c.storeAddr)
	if err != nil {
		return err
	}
	c.spec.Store.Addr = c.proxy.Addr()
	return nil
}

func (c *cell) teardown() {
	for _, w := range append(append([]*worker{}, c.consumers...), c.relays...) {
		if inc := w.cur(); inc != nil && !inc.exited() {
			_ = inc.signal(9)
			<-inc.done
		}
	}
	if c.proxy != nil {
		c.proxy.Close()
	}
	if c.admin != nil {
		c.admin.close()
	}
	if c.boltSrv != nil {
		_ = c.boltSrv.Close()
	}
}

func (c *cell) startWorkers() error {
	mk := func(role, name string, crash func() string) *worker {
		spec := c.spec
		spec.Role, spec.Name = role, name
		return &worker{name: name, exe: c.r.cfg.WorkerBinary, spec: spec, dir: c.dir, ns: c.r.env.ns, crashEnv: crash}
	}
	for i := range c.r.cfg.Relays {
		c.relays = append(c.relays, mk(RoleRelay, fmt.Sprintf("relay-%d", i), c.crashEnv(RoleRelay)))
	}
	for i := range c.r.cfg.Consumers {
		c.consumers = append(c.consumers, mk(RoleConsumer, fmt.Sprintf("consumer-%d", i), c.crashEnv(RoleConsumer)))
	}
	errs := make(chan error, len(c.relays)+len(c.consumers))
	for _, w := range append(append([]*worker{}, c.relays...), c.consumers...) {
		go func() { errs <- w.start() }()
	}
	var all []error
	for range len(c.relays) + len(c.consumers) {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// crashEnv arms the scenario's named crash point in workers of role:
// the n-th time the point is reached (n drawn from the cell's seed), up to
// MaxCrashes deaths per cell.
func (c *cell) crashEnv(role string) func() string {
	point := c.sc.Crash
	if point == "" || (point == AfterPublish) != (role == RoleRelay) {
		return nil
	}
	return func() string {
		if c.healed.Load() || c.crashes.Load() >= int64(c.r.cfg.MaxCrashes) {
			return ""
		}
		// Spread over a process's share of the work: a relay publishes
		// batches of up to 50 rows, a consumer handles its share.
		cfg := c.r.cfg
		if point == AfterPublish {
			// The fewest batches a relay publishes: its share of the
			// messages in batches of the relay's default size (256).
			// Batches of 50 (the producer's transactions) set the bound
			// before: a relay publishing fewer, larger batches while the
			// producer ran ahead never reached its crash point
			// (crash-after-publish/redis/kafka, 20,000 messages, no
			// crash).
			return fmt.Sprintf("%s@%d", point, c.intn(2, max(4, cfg.Messages/outbox.DefaultBatchSize/cfg.Relays)))
		}
		return fmt.Sprintf("%s@%d", point, c.intn(10, max(20, cfg.Messages/cfg.Consumers)))
	}
}

// supervise restarts workers that died without the harness killing them
// (a named crash point, or a failure, which is a problem).
func (c *cell) supervise(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, w := range append(append([]*worker{}, c.relays...), c.consumers...) {
			inc := w.cur()
			if inc == nil || !inc.exited() || inc.expect.Load() {
				continue
			}
			v := inc.final
			if p := CrashPointName(v[shm.CrashPoint]); p != "" && inc.killed {
				c.crashes.Add(1)
				c.markPid(inc.pid, "crash "+p)
				f := Fault{Kind: "crash " + p, Target: w.name}
				if w.spec.Role == RoleRelay {
					f.Hit = v[shm.RelayPublished] > 0 && v[shm.RelayClaimed] > 0
					f.Evidence = fmt.Sprintf("pid %d died holding %d outbox rows it had published", inc.pid, v[shm.RelayClaimed])
				} else {
					f.Hit = v[shm.CrashHeld] > 0 || v[shm.CrashUnsettled] > 0
					f.Evidence = fmt.Sprintf("pid %d died with %d claims in handlers, %d deliveries unsettled", inc.pid, v[shm.CrashHeld], v[shm.CrashUnsettled])
				}
				c.addFault(f)
			} else {
				c.problem("%s (pid %d) exited on its own (killed=%v); see %s", w.name, inc.pid, inc.killed, filepath.Join(c.dir, w.name+".log"))
			}
			if err := w.start(); err != nil {
				c.problem("restart %s: %v", w.name, err)
			}
		}
	}
}

// heal ends every fault still in force: toxics removed, the proxy up, the
// partition healed, stopped processes continued, servers and workers
// running.
func (c *cell) heal(ctx context.Context) {
	c.healed.Store(true)
	c.proxy.Clear()
	if err := c.proxy.Down(false); err != nil {
		c.problem("heal proxy: %v", err)
	}
	if ns := c.r.env.ns; ns != nil && ns.Partitioned() {
		if err := ns.Partition(false); err != nil {
			c.problem("heal partition: %v", err)
		}
	}
	for _, w := range append(append([]*worker{}, c.relays...), c.consumers...) {
		if inc := w.cur(); inc != nil && !inc.exited() {
			_ = inc.signal(18) // SIGCONT
			if w.clock != 0 {
				w.clock = 0
				_ = w.send("clock 0s")
			}
		}
	}
}

// produce commits the originals to the outbox in small transactions,
// paced over the first 90% of the fault loop, and publishes the
// duplicates straight to the broker with its dedup off (a producer's retry
// that lands after the broker's dedup window).
func (c *cell) produce(ctx context.Context) error {
	ob, err := pgoutbox.New(pgoutbox.Config{Pool: c.ledger, Schema: c.name, Table: "outbox", Logger: quiet()})
	if err != nil {
		return err
	}
	dup, err := c.admin.publisher(false)
	if err != nil {
		return err
	}
	defer dup.Close()
	n := c.r.cfg.Messages
	window := time.Duration(float64(c.r.cfg.Duration) * 0.9)
	start := time.Now()
	const chunk = 50
	var ferr error
	e2etest.Generate(c.spec.Broker.Topic, 0, n, c.dupFrac, func(orig, dups []*broker.Message) {
		if ferr != nil {
			return
		}
		for j := 0; j < len(orig); j += chunk {
			part := orig[j:min(j+chunk, len(orig))]
			msgs := make([]outbox.Message, len(part))
			for k, m := range part {
				msgs[k] = outbox.Message{ID: m.ID, Topic: m.Topic, Payload: m.Payload, Headers: m.Headers}
			}
			if ferr = retry(ctx, func() error {
				err := pgx.BeginFunc(ctx, c.ledger, func(tx pgx.Tx) error {
					_, err := ob.Enqueue(ctx, tx, msgs...)
					return err
				})
				if errors.Is(err, outbox.ErrDuplicateID) {
					return nil // an earlier try committed and lost its answer
				}
				return err
			}); ferr != nil {
				return
			}
			done := c.produced.Add(int64(len(part)))
			if d := time.Until(start.Add(time.Duration(float64(window) * float64(done) / float64(n)))); d > 0 {
				sleepCtx(ctx, d)
			}
		}
		if len(dups) > 0 {
			ferr = retry(ctx, func() error { return dup.Publish(ctx, dups...) })
			c.published.Add(int64(len(dups)))
		}
	})
	return ferr
}

// progress logs, every ProgressEvery, what the producer has committed and
// how many effects the ledger holds: the cell's throughput while faults
// run, not only over the whole cell.
func (c *cell) progress(ctx context.Context) {
	every := c.r.cfg.ProgressEvery
	if every <= 0 || c.r.cfg.Progress == nil {
		return
	}
	ob, err := pgoutbox.New(pgoutbox.Config{Pool: c.ledger, Schema: c.name, Table: "outbox", Logger: quiet()})
	if err != nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last, lastAt := int64(0), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var rows int64
		if err := c.ledger.QueryRow(ctx, `SELECT count(*) FROM `+c.name+`.ledger`).Scan(&rows); err != nil {
			continue
		}
		st, _ := ob.Stats(ctx)
		now := time.Now()
		c.logf("progress %s: committed %d/%d, outbox %d pending, ledger %d rows (%.0f/s over the last %s)", now.Sub(c.start).Round(time.Second),
			c.produced.Load(), c.r.cfg.Messages, st.Pending, rows, float64(rows-last)/now.Sub(lastAt).Seconds(), now.Sub(lastAt).Round(time.Second))
		last, lastAt = rows, now
	}
}

// retry calls f until it succeeds or ctx ends (the servers it talks to
// may be down for a while: that is the point).
func retry(ctx context.Context, f func() error) error {
	d := 100 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, d)
		d = min(2*d, 2*time.Second)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// drain waits until every original is in the ledger or dead-lettered, the
// outbox is empty, the consumers hold nothing and the broker has nothing
// pending for their group; failed outbox rows are re-queued as an
// operator would (and counted).
func (c *cell) drain(ctx context.Context) {
	t := c.r.cfg.Timing
	limit := c.r.cfg.Drain
	if limit == 0 {
		limit = 2*time.Minute + 6*(t.lease()+t.redelivery(c.Broker))
	}
	deadline := time.Now().Add(limit)
	n := c.r.cfg.Messages
	wantDone, wantDead := n-poisons(n, c.poison), poisons(n, c.poison)
	quietSince := time.Time{}
	for {
		state, done := c.drainCheck(ctx, wantDone, wantDead)
		c.drainState = state
		switch {
		case done && quietSince.IsZero():
			quietSince = time.Now()
		case !done:
			quietSince = time.Time{}
		}
		// Settled for a second: nothing is left to redeliver.
		if done && time.Since(quietSince) >= time.Second {
			c.drainedAt = time.Now()
			c.logf("drained after %s: %s", time.Since(c.start).Round(time.Millisecond), state)
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.problem("not drained %s after the fault loop: %s", limit, state)
			c.drainedAt = time.Now()
			return
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

func (c *cell) drainCheck(ctx context.Context, wantDone, wantDead int) (string, bool) {
	var parts []string
	ok := true
	ob, _ := pgoutbox.New(pgoutbox.Config{Pool: c.ledger, Schema: c.name, Table: "outbox"})
	if st, err := ob.Stats(ctx); err != nil {
		parts, ok = append(parts, "outbox: "+err.Error()), false
	} else {
		if st.Failed > 0 {
			if rows, err := ob.ListFailed(ctx, 0, 1000); err == nil && len(rows) > 0 {
				ids := make([]string, len(rows))
				for i, r := range rows {
					ids[i] = r.ID
				}
				if k, err := ob.Requeue(ctx, ids); err == nil {
					c.requeued.Add(int64(k))
				}
			}
		}
		if st.Pending > 0 || st.Failed > 0 || c.produced.Load() < int64(c.r.cfg.Messages) {
			ok = false
		}
		parts = append(parts, fmt.Sprintf("outbox %d pending %d failed", st.Pending, st.Failed))
	}
	var done int
	if err := c.ledger.QueryRow(ctx, `SELECT count(DISTINCT msg_id) FROM `+c.name+`.ledger`).Scan(&done); err != nil {
		parts, ok = append(parts, "ledger: "+err.Error()), false
	}
	parts = append(parts, fmt.Sprintf("ledger %d/%d ids", done, wantDone))
	ok = ok && done >= wantDone
	dead, err := c.admin.dlqCount(ctx)
	if err != nil {
		parts, ok = append(parts, "dlq: "+err.Error()), false
	}
	parts = append(parts, fmt.Sprintf("dead letters %d/%d", dead, wantDead))
	ok = ok && dead >= wantDead
	var held shm.Values
	for _, w := range c.consumers {
		if inc := w.cur(); inc != nil && !inc.exited() {
			held = shm.Sum(held, inc.ctr.Snapshot())
		}
	}
	parts = append(parts, fmt.Sprintf("consumers hold %d in handlers, %d unsettled", held[shm.InHandler], held[shm.Unsettled]))
	ok = ok && held[shm.InHandler] == 0 && held[shm.Unsettled] == 0
	idle, st, err := c.admin.idle(ctx)
	if err != nil {
		st = err.Error()
	}
	parts = append(parts, "broker: "+st)
	ok = ok && idle
	return strings.Join(parts, ", "), ok
}

func poisons(n, every int) int {
	k := 0
	for i := range n {
		if isPoison(i, every) {
			k++
		}
	}
	return k
}

func (c *cell) stopWorkers() {
	var wg sync.WaitGroup
	for _, w := range append(append([]*worker{}, c.relays...), c.consumers...) {
		wg.Go(func() { w.stop(45 * time.Second) })
	}
	wg.Wait()
}
