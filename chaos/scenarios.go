package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/chaos/internal/shm"
	"github.com/idem-dev/idem/e2etest"
)

// Fault is one fault injected into a cell, and whether it hit in-flight
// work (with the evidence read from the processes' counters).
type Fault struct {
	Kind     string        `json:"kind"`
	Target   string        `json:"target"`
	At       time.Duration `json:"at_ns"`
	Hit      bool          `json:"hit"`
	Evidence string        `json:"evidence"`
}

// Scenario is a fault loop.
type Scenario struct {
	Name string
	Doc  string
	// Faults of the catalogue (../shared/DESIGN.md) it exercises.
	Covers []string
	// Crash is the named crash point armed in every (re)started worker of
	// the role it belongs to.
	Crash string
	// Poison overrides the poison rate (1 in Poison messages).
	Poison int
	// inject runs one fault; the loop calls it until the cell's fault
	// loop ends (always at least once), with a pause between.
	inject func(c *cell, ctx context.Context)
	pause  [2]time.Duration
}

var scenarios = []*Scenario{
	{Name: "kill", Doc: "SIGKILL of a consumer (3 in 4) or a relay at a random moment while it holds claims or outbox rows; restarted at once",
		Covers: []string{"F1", "F2", "F4", "F7", "F8"}, inject: (*cell).killOne, pause: [2]time.Duration{time.Second, 3 * time.Second}},
	{Name: "crash-after-claim", Doc: "consumers SIGKILL themselves at the n-th claim, before the effect", Crash: AfterClaim,
		Covers: []string{"F2"}},
	{Name: "crash-after-effect", Doc: "consumers SIGKILL themselves after the effect, before the claim is completed", Crash: AfterEffect,
		Covers: []string{"F1", "F16"}},
	{Name: "crash-after-complete", Doc: "consumers SIGKILL themselves after completing the claim, before the ack", Crash: AfterComplete,
		Covers: []string{"F1", "F4"}},
	{Name: "crash-after-publish", Doc: "outbox relays SIGKILL themselves after the broker accepted a batch, before marking it sent", Crash: AfterPublish,
		Covers: []string{"F6", "F7"}},
	{Name: "stall", Doc: "SIGSTOP of a consumer holding claims for longer than the lease plus the broker's redelivery time, then SIGCONT: the stale worker must be fenced",
		Covers: []string{"F3", "F5", "F8"}, inject: (*cell).stall, pause: [2]time.Duration{time.Second, 2 * time.Second}},
	{Name: "store-restart", Doc: "the store's server killed (PostgreSQL: immediate shutdown) with claims in flight, started again after 0.5-2 s",
		Covers: []string{"F9", "F10", "F17"}, inject: (*cell).restartStore, pause: [2]time.Duration{2 * time.Second, 4 * time.Second}},
	{Name: "broker-restart", Doc: "the broker killed (nats-server SIGKILL, kfake closed) with deliveries unsettled, started again after 0.5-2 s",
		Covers: []string{"F4", "F8"}, inject: (*cell).restartBroker, pause: [2]time.Duration{2 * time.Second, 4 * time.Second}},
	{Name: "proxy", Doc: "the store's connections through toxiproxy: latency, resets, connections dropped after a stall, replies cut",
		Covers: []string{"F4", "F17"}, inject: (*cell).toxic, pause: [2]time.Duration{500 * time.Millisecond, 1500 * time.Millisecond}},
	{Name: "partition", Doc: "the consumers' network namespace cut from the store (not the broker) for longer than the lease",
		Covers: []string{"F10", "F17"}, inject: (*cell).partition, pause: [2]time.Duration{2 * time.Second, 3 * time.Second}},
	{Name: "outage", Doc: "the store unreachable (connections closed and refused) for longer than the lease, every retry and the broker's delivery limit",
		Covers: []string{"F10"}, inject: (*cell).outage, pause: [2]time.Duration{2 * time.Second, 3 * time.Second}},
	{Name: "clock", Doc: "the clock of a consumer holding claims stepped forward or back by twice the lease (the stores keep their own clocks)",
		Covers: []string{"F12"}, inject: (*cell).clockStep, pause: [2]time.Duration{time.Second, 2 * time.Second}},
	{Name: "poison", Doc: "1 message in 40 always fails (half with idem.Permanent) and 1 in 50 fails once per process: each poison message dead-lettered exactly once",
		Covers: []string{"F14"}, Poison: 40, inject: (*cell).poisonCheck},
	{Name: "mixed", Doc: "every fault above, one at a time, chosen at random (the long run)",
		Covers: []string{"F1", "F2", "F3", "F4", "F5", "F7", "F8", "F9", "F10", "F12", "F14", "F17"},
		inject: (*cell).mixed, pause: [2]time.Duration{time.Second, 3 * time.Second}},
}

// ScenarioNames lists the scenarios.
func ScenarioNames() []string {
	out := make([]string, len(scenarios))
	for i, s := range scenarios {
		out[i] = s.Name
	}
	return out
}

// Scenarios returns the scenario descriptions.
func Scenarios() []Scenario {
	out := make([]Scenario, len(scenarios))
	for i, s := range scenarios {
		out[i] = *s
	}
	return out
}

func scenarioByName(name string) (*Scenario, bool) {
	for _, s := range scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return nil, false
}

func jsonSpec(s Spec) (string, error) {
	b, err := json.Marshal(s)
	return string(b), err
}

// run is the fault loop: inject, pause, until ctx ends or the producer
// has committed every message (at least one injection), so that faults
// meet messages still flowing. Crash-point scenarios only wait: the
// workers kill themselves.
func (s *Scenario) run(ctx context.Context, c *cell) {
	more := func() bool { return ctx.Err() == nil && c.produced.Load() < int64(c.r.cfg.Messages) }
	if s.inject == nil {
		for more() {
			sleepCtx(ctx, 100*time.Millisecond)
		}
		return
	}
	for first := true; first || more(); first = false {
		s.inject(c, ctx)
		sleepCtx(ctx, c.between(s.pause[0], s.pause[1]))
	}
}

// live sums the counters of the running consumer processes.
func (c *cell) live() shm.Values {
	var v shm.Values
	for _, w := range c.consumers {
		if inc := w.cur(); inc != nil && !inc.exited() {
			v = shm.Sum(v, inc.ctr.Snapshot())
		}
	}
	return v
}

// waitFor polls cond for up to d.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// inFlight waits (up to 10 s) for the consumers to hold claims, so a
// fault starts on in-flight work, and returns their counters; ok false:
// nothing held (the work is done), and the fault is skipped.
func (c *cell) inFlight(ctx context.Context, what string) (shm.Values, bool) {
	ok := waitFor(ctx, 10*time.Second, func() bool { return c.live()[shm.InHandler] > 0 })
	if !ok {
		c.logf("no claims in flight: no %s this round", what)
	}
	return c.live(), ok
}

// busy picks the fault's victim among ws: waits up to d for processes
// whose slot (claims in handlers, outbox rows) is non-zero and draws one
// of them (a Kafka consumer just restarted may own no partition yet);
// with none busy by then, any running one, and busy false.
func (c *cell) busy(ctx context.Context, ws []*worker, slot shm.Slot, d time.Duration) (*worker, *incarnation, bool) {
	var cands []*worker
	find := func() bool {
		cands = cands[:0]
		for _, w := range ws {
			if inc := w.cur(); inc != nil && !inc.exited() && inc.ctr.Get(slot) > 0 {
				cands = append(cands, w)
			}
		}
		return len(cands) > 0
	}
	ok := waitFor(ctx, d, find)
	if !ok {
		for _, w := range ws {
			if inc := w.cur(); inc != nil && !inc.exited() {
				cands = append(cands, w)
			}
		}
	}
	if len(cands) == 0 {
		return nil, nil, false
	}
	w := cands[c.intn(0, len(cands)-1)]
	return w, w.cur(), ok
}

func storeErrs(v shm.Values) int64 { return v[shm.StoreErrors] + v[shm.ClaimErrors] }

// storeErrors is every consumer incarnation's store errors so far (a
// process that died since does not take its count away).
func (c *cell) storeErrors() int64 {
	var n int64
	for _, w := range c.consumers {
		n += storeErrs(w.totals())
	}
	return n
}

func (c *cell) killOne(ctx context.Context) {
	relay := c.intn(0, 3) == 0
	ws, slot := c.consumers, shm.InHandler
	if relay {
		ws, slot = c.relays, shm.RelayClaimed
	}
	wait := 10 * time.Second
	if relay {
		wait = 3 * time.Second
	}
	w, inc, busy := c.busy(ctx, ws, slot, wait)
	if !busy && relay {
		// The outbox is drained: nothing for a relay to hold any more.
		relay, slot = false, shm.InHandler
		w, inc, busy = c.busy(ctx, c.consumers, slot, 10*time.Second)
	}
	if !busy {
		c.logf("no process holds work: no kill this round")
		return
	}
	holds := func(v shm.Values) bool { return v[shm.InHandler] > 0 || v[shm.Unsettled] > 0 }
	if relay {
		holds = func(v shm.Values) bool { return v[shm.RelayClaimed] > 0 }
	}
	v, err := w.freezeAndKill(holds, 3*time.Second)
	if err != nil {
		c.problem("kill %s: %v", w.name, err)
	}
	c.markPid(inc.pid, "killed")
	f := Fault{Kind: "sigkill", Target: w.name}
	if relay {
		f.Hit = v[shm.RelayClaimed] > 0
		f.Evidence = fmt.Sprintf("pid %d held %d outbox rows", inc.pid, v[shm.RelayClaimed])
	} else {
		f.Hit = v[shm.InHandler] > 0 || v[shm.Unsettled] > 0
		f.Evidence = fmt.Sprintf("pid %d held %d claims in handlers, %d deliveries unsettled", inc.pid, v[shm.InHandler], v[shm.Unsettled])
	}
	c.addFault(f)
	if err := w.start(); err != nil {
		c.problem("restart %s: %v", w.name, err)
	}
}

func (c *cell) stall(ctx context.Context) {
	w, inc, busy := c.busy(ctx, c.consumers, shm.InHandler, 10*time.Second)
	if !busy {
		c.logf("no consumer holds claims: no stall this round")
		return
	}
	// Stopped while it holds claims: the handlers busy() saw may have
	// finished before the signal; let it run a moment and stop it again,
	// for up to 3 s.
	var before shm.Values
	var stopped time.Time
	for deadline := time.Now().Add(3 * time.Second); ; {
		if err := inc.signal(syscall.SIGSTOP); err != nil {
			c.problem("stop %s: %v", w.name, err)
			return
		}
		stopped = time.Now()
		time.Sleep(5 * time.Millisecond)
		before = inc.ctr.Snapshot()
		if before[shm.InHandler] > 0 || time.Now().After(deadline) {
			break
		}
		_ = inc.signal(syscall.SIGCONT)
		time.Sleep(7 * time.Millisecond)
	}
	c.markPid(inc.pid, "stalled")
	t := c.r.cfg.Timing
	// Past the lease and until the broker has handed the messages to
	// another consumer (Kafka: the session timeout, then a rebalance
	// that waits up to RevokeDrain for the survivors).
	d := t.lease() + t.redelivery(c.Broker) + 2*time.Second
	if c.Broker == "kafka" {
		d += 6 * time.Second
	}
	// Not ctx: the stall must outlast the lease whatever the loop says.
	time.Sleep(d)
	// Then, under load, until another holder has completed a message the
	// stopped process holds (its effect will be refused after SIGCONT):
	// how soon the broker hands it over and a consumer reaches it is not
	// a time the harness can derive.
	takeover := ""
	if idx := before[shm.HeldIdx]; idx > 0 {
		takeover = c.awaitTakeover(e2etest.ID(int(idx-1)), 2*d+30*time.Second)
	}
	_ = inc.signal(syscall.SIGCONT)
	fenced := func() int64 {
		v := inc.ctr.Snapshot()
		return v[shm.Fenced] - before[shm.Fenced] + v[shm.LeaseLost] - before[shm.LeaseLost]
	}
	waitFor(context.Background(), t.lease()+5*time.Second, func() bool { return fenced() > 0 || inc.exited() })
	c.addFault(Fault{Kind: "sigstop", Target: w.name, Hit: before[shm.InHandler] > 0,
		Evidence: fmt.Sprintf("pid %d stopped %s holding %d claims in handlers%s; after SIGCONT %d of its effects fenced or leases found lost",
			inc.pid, time.Since(stopped).Round(time.Millisecond), before[shm.InHandler], takeover, fenced())})
}

// awaitTakeover waits up to d for the record of key to be completed (or
// failed) by another holder, read from the store's own address; it says
// what it saw.
func (c *cell) awaitTakeover(key string, d time.Duration) string {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	st, err := openStore(ctx, c.spec, c.storeAddr)
	if err != nil {
		return fmt.Sprintf(" (%s: store not readable: %v)", key, err)
	}
	defer st.close()
	start := time.Now()
	for {
		rec, err := st.store.Get(ctx, []byte(key))
		if err == nil && (rec.State == idem.StateCompleted || rec.State == idem.StateFailed) {
			return fmt.Sprintf(" (%s among them, %s by another holder %s after the minimum stall)", key, rec.State, time.Since(start).Round(time.Millisecond))
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return fmt.Sprintf(" (%s among them, not taken over %s after the minimum stall)", key, time.Since(start).Round(time.Millisecond))
		}
	}
}

func (c *cell) restartStore(ctx context.Context) {
	v, ok := c.inFlight(ctx, "store restart")
	if !ok {
		return
	}
	e0, began := c.storeErrors(), time.Now()
	if err := c.storeSrv.Crash(); err != nil {
		c.problem("crash store: %v", err)
		return
	}
	down := c.between(500*time.Millisecond, 2*time.Second)
	time.Sleep(down)
	if err := c.storeSrv.Start(context.Background()); err != nil {
		c.problem("restart store: %v", err)
		return
	}
	late := c.lateDuplicates(ctx, began)
	waitFor(ctx, 10*time.Second, func() bool { return c.storeErrors() > e0 })
	errs := c.storeErrors() - e0
	c.addFault(Fault{Kind: "store restart", Target: c.Store, Hit: v[shm.InHandler] > 0 && errs > 0,
		Evidence: fmt.Sprintf("%d claims in handlers, %d deliveries unsettled when it died; down %s; %d store errors after%s",
			v[shm.InHandler], v[shm.Unsettled], down.Round(time.Millisecond), errs, late)})
}

func (c *cell) restartBroker(ctx context.Context) {
	if !waitFor(ctx, 10*time.Second, func() bool { return c.live()[shm.Unsettled] > 0 }) {
		c.logf("no deliveries unsettled: no broker restart this round")
		return
	}
	v := c.live()
	if err := c.brokerSrv.Crash(); err != nil {
		c.problem("crash broker: %v", err)
		return
	}
	down := c.between(500*time.Millisecond, 2*time.Second)
	time.Sleep(down)
	if err := c.brokerSrv.Start(context.Background()); err != nil {
		c.problem("restart broker: %v", err)
		return
	}
	how := ""
	if c.Broker == "rabbit" {
		how = " (stopped with SIGTERM, not SIGKILL: docs/reliability.md)"
	}
	c.addFault(Fault{Kind: "broker restart", Target: c.Broker, Hit: v[shm.Unsettled] > 0,
		Evidence: fmt.Sprintf("%d deliveries unsettled, %d claims in handlers when it died; down %s%s", v[shm.Unsettled], v[shm.InHandler], down.Round(time.Millisecond), how)})
}

var toxics = []struct {
	name string
	json string
	min  time.Duration
	max  time.Duration
	errs bool // must cause store errors to count as a hit
}{
	{"latency", `{"name":"t","type":"latency","stream":"downstream","attributes":{"latency":150,"jitter":100}}`, 2 * time.Second, 4 * time.Second, false},
	{"reset", `{"name":"t","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`, 300 * time.Millisecond, time.Second, true},
	// Data stops; each connection is closed after 1.5 s (toxiproxy's
	// timeout toxic), which the clients see as a reset mid-call.
	{"drop", `{"name":"t","type":"timeout","stream":"upstream","attributes":{"timeout":1500}}`, 2 * time.Second, 3 * time.Second, true},
	{"cut-reply", `{"name":"t","type":"limit_data","stream":"downstream","attributes":{"bytes":200}}`, 300 * time.Millisecond, time.Second, true},
}

func (c *cell) toxic(ctx context.Context) {
	tx := toxics[c.intn(0, len(toxics)-1)]
	v, ok := c.inFlight(ctx, "proxy fault")
	if !ok {
		return
	}
	e0 := c.storeErrors()
	if err := c.proxy.Toxic(tx.json); err != nil {
		c.problem("toxic %s: %v", tx.name, err)
		return
	}
	d := c.between(tx.min, tx.max)
	began := time.Now()
	time.Sleep(d)
	if tx.errs {
		// A fault that must cut calls stays until one was cut (a loaded
		// machine may send nothing to the store for a while), up to 3 s
		// more; it hit nothing otherwise. Not ctx: the loop's end does
		// not end a fault.
		waitFor(context.Background(), 3*time.Second, func() bool { return c.storeErrors() > e0 })
		d = time.Since(began)
	}
	c.proxy.Clear()
	// A call stuck behind the toxic fails when the client gives up on it
	// (the store clients' own timeouts, up to ~10 s).
	waitFor(ctx, 12*time.Second, func() bool { return !tx.errs || c.storeErrors() > e0 })
	errs := c.storeErrors() - e0
	c.addFault(Fault{Kind: "proxy " + tx.name, Target: c.Store, Hit: v[shm.InHandler] > 0 && (!tx.errs || errs > 0),
		Evidence: fmt.Sprintf("%s with %d claims in handlers; %d store errors", d.Round(time.Millisecond), v[shm.InHandler], errs)})
}

func (c *cell) partition(ctx context.Context) {
	ns := c.r.env.ns
	if ns == nil {
		c.addFault(Fault{Kind: "partition", Target: c.Store, Evidence: "not run: no network namespace (needs root and iproute2)"})
		return
	}
	v, ok := c.inFlight(ctx, "partition")
	if !ok {
		return
	}
	e0, began := c.storeErrors(), time.Now()
	if err := ns.Partition(true); err != nil {
		c.problem("partition: %v", err)
		return
	}
	d := c.r.cfg.Timing.lease() + c.between(time.Second, 3*time.Second)
	time.Sleep(d)
	late := c.lateDuplicates(ctx, began)
	during, errs := c.live(), c.storeErrors()-e0
	if err := ns.Partition(false); err != nil {
		c.problem("heal partition: %v", err)
	}
	c.addFault(Fault{Kind: "partition", Target: c.Store, Hit: v[shm.InHandler] > 0,
		Evidence: fmt.Sprintf("%s with %d claims in handlers; meanwhile %d store errors, %d effects completed%s",
			d.Round(time.Millisecond), v[shm.InHandler], errs, during[shm.Handled]-v[shm.Handled], late)})
}

// outageLength outlasts the lease, the guard's settle window (a lease),
// and, where the broker stops redelivering after MaxDeliver (NATS, Redis
// Streams: 20; RabbitMQ's quorum queue: a delivery limit of 20),
// MaxDeliver naks of StoreDownDelay.
func (c *cell) outageLength() time.Duration {
	t := c.r.cfg.Timing
	d := 2 * t.lease()
	if c.Broker == "nats" || c.Broker == "streams" || c.Broker == "rabbit" {
		d = max(d, 20*t.storeDownDelay())
	}
	return d + 2*time.Second
}

func (c *cell) outage(ctx context.Context) {
	v, ok := c.inFlight(ctx, "outage")
	if !ok {
		return
	}
	e0, began := c.storeErrors(), time.Now()
	if err := c.proxy.Down(true); err != nil {
		c.problem("outage: %v", err)
		return
	}
	d := c.outageLength()
	time.Sleep(d)
	late := c.lateDuplicates(ctx, began)
	errs := c.storeErrors() - e0
	if err := c.proxy.Down(false); err != nil {
		c.problem("end outage: %v", err)
	}
	c.addFault(Fault{Kind: "outage", Target: c.Store, Hit: v[shm.InHandler] > 0 && errs > 0,
		Evidence: fmt.Sprintf("%s with %d claims in handlers, %d deliveries unsettled; %d store errors during it%s",
			d.Round(time.Millisecond), v[shm.InHandler], v[shm.Unsettled], errs, late)})
}

// lateDuplicates (Config.LateDuplicates) publishes once more, straight
// to the broker (no dedup), every message whose completion went
// unrecorded since since: the guards' completions answered ErrUnrecorded
// (the pending rows) and the consumers' acks of them (the unrecorded
// rows; the same messages unless a consumer ignored the error), and waits
// a store-down delay and a half, so that they are fetched: called as an
// outage or a partition ends (after a store restart, once it is up), they
// are claimed while the guard that ran them may still be recording their
// completions in the background, the leases lapsed. The process that ran
// one must answer its own claim in progress (the guard's holding set),
// never claim it again: that re-run is a duplicate effect. Another
// process may take a lapsed key over (the window of docs/guard.md), which
// the check accepts only with the first holder's unrecorded ack. It says
// what it did, for the fault's evidence.
func (c *cell) lateDuplicates(ctx context.Context, since time.Time) string {
	if !c.r.cfg.LateDuplicates {
		return ""
	}
	// Not the loop's ctx: a fault that ends with the loop still heals.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	rows, err := c.ledger.Query(ctx, `SELECT msg_id FROM `+c.name+`.unrecorded WHERE at >= $1
		UNION SELECT msg_id FROM `+c.name+`.pending WHERE at >= $1`, since)
	if err != nil {
		return fmt.Sprintf("; unrecorded completions not read: %v", err)
	}
	var msgs []*broker.Message
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			break
		}
		if i, ok := e2etest.Index(id); ok {
			msgs = append(msgs, e2etest.Message(c.spec.Broker.Topic, i))
		}
	}
	rows.Close()
	if len(msgs) == 0 {
		return ""
	}
	pub, err := c.admin.publisher(false)
	if err != nil {
		return fmt.Sprintf("; %d unrecorded completions, not published again: %v", len(msgs), err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, msgs...); err != nil {
		return fmt.Sprintf("; %d unrecorded completions, not published again: %v", len(msgs), err)
	}
	c.published.Add(int64(len(msgs)))
	time.Sleep(c.r.cfg.Timing.storeDownDelay() * 3 / 2)
	return fmt.Sprintf("; %d messages whose completion went unrecorded, published again", len(msgs))
}

func (c *cell) clockStep(ctx context.Context) {
	// The handlers busy() saw may finish before the step is sent (seen at
	// load ~35: the step then hit nothing): pick again until the count read
	// right before sending is not 0, for up to 10 s.
	var w *worker
	var inc *incarnation
	var held int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		var busy bool
		w, inc, busy = c.busy(ctx, c.consumers, shm.InHandler, time.Until(deadline))
		if !busy {
			c.logf("no consumer holds claims: no clock step this round")
			return
		}
		if held = inc.ctr.Get(shm.InHandler); held > 0 {
			break
		}
		if time.Now().After(deadline) {
			c.logf("no consumer held claims when the step was due: no clock step this round")
			return
		}
	}
	step := 2 * c.r.cfg.Timing.lease()
	if c.intn(0, 1) == 0 {
		step = -step
	}
	if err := w.send("clock " + step.String()); err != nil {
		c.problem("clock %s: %v", w.name, err)
		return
	}
	w.clock = step
	waitFor(ctx, 2*time.Second, func() bool { return inc.ctr.Get(shm.ClockOffset) == step.Milliseconds() })
	c.addFault(Fault{Kind: "clock step", Target: w.name, Hit: held > 0,
		Evidence: fmt.Sprintf("pid %d clock %+v with %d claims in handlers", inc.pid, step, held)})
	time.Sleep(c.r.cfg.Timing.lease() + c.between(0, time.Second))
	_ = w.send("clock 0s")
	w.clock = 0
}

// poisonCheck: the poison scenario injects nothing but its messages; the
// fault is recorded once the handlers have failed on some.
func (c *cell) poisonCheck(ctx context.Context) {
	for ctx.Err() == nil && c.produced.Load() < int64(c.r.cfg.Messages) {
		sleepCtx(ctx, 100*time.Millisecond)
	}
	var poisoned int64
	for _, w := range c.consumers {
		poisoned += w.totals()[shm.Poisoned]
	}
	c.addFault(Fault{Kind: "poison", Target: "handlers", Hit: poisoned > 0,
		Evidence: fmt.Sprintf("%d poison messages, %d handler calls failed on them so far", poisons(c.r.cfg.Messages, c.poison), poisoned)})
}

func (c *cell) mixed(ctx context.Context) {
	fs := []func(*cell, context.Context){(*cell).killOne, (*cell).stall, (*cell).restartStore, (*cell).restartBroker,
		(*cell).toxic, (*cell).outage, (*cell).clockStep}
	if c.r.env.ns != nil {
		fs = append(fs, (*cell).partition)
	}
	fs[c.intn(0, len(fs)-1)](c, ctx)
}
