package e2etest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

// The fault scenario's message classes, by index: poison messages always
// fail (half of them with idem.Permanent, dead-lettered at once; the others
// use up MaxAttempts), flaky ones fail on their first attempt in each
// process and then succeed.
func Poison(i int) bool          { return i%500 == 13 }
func PermanentPoison(i int) bool { return i%1000 == 13 }
func Flaky(i int) bool           { return i%50 == 7 }

// Index is the index of message id (as made by ID).
func Index(id string) (int, bool) {
	s, ok := strings.CutPrefix(id, "msg-")
	if !ok || len(s) != 7 {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	return i, err == nil
}

var (
	errPoison = errors.New("e2etest: poison message")
	errFlaky  = errors.New("e2etest: flaky handler failure")
	errGated  = errors.New("e2etest: handler failure during the outage")
	// errGatedDown: the handler's own database is down with the store. The
	// runtime classifies it as unavailability: it holds the delivery with
	// its claim (no attempt spent) and its worker goes on with others.
	errGatedDown = fmt.Errorf("e2etest: the handler's database is down during the outage: %w", idem.ErrUnavailable)
)

// Effects are the fault scenario's handlers. With Store set the effect and
// the completion of the handler's claim commit in one transaction (kill
// safe: a process killed between the two leaves neither); without it the
// effect is an autocommitted INSERT and the runtime completes the claim
// afterwards (a crash between the two would run the effect twice, which is
// why the killed process uses Store).
type Effects struct {
	Ledger *Ledger
	Store  *pgstore.Store
	Gate   *Gate
	// Delay is how long each effect takes, so claims are in flight when
	// a fault hits.
	Delay time.Duration
	// Apply, when > 0, is how many effects Handler applies: once Apply
	// have run (or are under way), every later call, and every call for
	// a poison message from the start, waits for its context to end and
	// runs nothing. A child whose effects commit apart from their records
	// uses it to stop with claims held and no effect between its commit
	// and its completion (see ChildConfig.Store).
	Apply int64

	tried                  sync.Map // flaky ids that failed once here
	poisoned, flakes, runs atomic.Int64
	applying               atomic.Int64 // with Apply: effects applied or under way
}

// reserve takes one of Apply's effects for m; false for a poison message
// or when every one is taken.
func (e *Effects) reserve(m *broker.Message) bool {
	if i, ok := Index(m.ID); ok && Poison(i) {
		return false
	}
	for {
		n := e.applying.Load()
		if n >= e.Apply {
			return false
		}
		if e.applying.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Failures reports how many handler calls failed as poison and as flaky.
func (e *Effects) Failures() (poison, flaky int64) { return e.poisoned.Load(), e.flakes.Load() }

// fail returns the handler error message m gets on this call, if any.
func (e *Effects) fail(m *broker.Message) error {
	i, ok := Index(m.ID)
	switch {
	case !ok:
		return nil
	case PermanentPoison(i):
		e.poisoned.Add(1)
		return idem.Permanent(errPoison)
	case Poison(i):
		e.poisoned.Add(1)
		return errPoison
	case Flaky(i):
		if _, again := e.tried.LoadOrStore(m.ID, true); !again {
			e.flakes.Add(1)
			return errFlaky
		}
	}
	return nil
}

func (e *Effects) before(ctx context.Context, n int, m *broker.Message) error {
	if e.Gate != nil {
		if err := e.Gate.pass(ctx, n); err != nil {
			return err
		}
	}
	if e.Delay > 0 {
		sleepCtx(ctx, e.Delay)
	}
	if err := e.fail(m); err != nil {
		return err
	}
	e.runs.Add(1)
	return nil
}

// Handler is the single-mode effect.
func (e *Effects) Handler() consumer.Handler {
	if e.Apply <= 0 {
		return e.handle
	}
	return func(ctx context.Context, m *broker.Message) ([]byte, error) {
		if !e.reserve(m) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		v, err := e.handle(ctx, m)
		if err != nil {
			e.applying.Add(-1) // not applied: a retry may take the slot again
		}
		return v, err
	}
}

func (e *Effects) handle(ctx context.Context, m *broker.Message) ([]byte, error) {
	if err := e.before(ctx, 1, m); err != nil {
		return nil, err
	}
	if e.Store == nil {
		return e.Ledger.Insert()(ctx, m)
	}
	key, _ := consumer.KeyFromContext(ctx)
	token, ok := consumer.TokenFromContext(ctx)
	if !ok {
		return nil, idem.Permanent(errors.New("e2etest: no fencing token in the handler's context"))
	}
	return nil, pgx.BeginFunc(ctx, e.Ledger.Pool, func(tx pgx.Tx) error {
		if err := e.Ledger.Copy(ctx, tx, []*broker.Message{m}); err != nil {
			return err
		}
		return e.Store.CompleteTx(ctx, tx, key, token, nil)
	})
}

// BatchHandler is the batch-mode effect (autocommitted: Store unused).
func (e *Effects) BatchHandler() consumer.BatchHandler {
	return func(ctx context.Context, msgs []*broker.Message) error {
		if e.Gate != nil {
			if err := e.Gate.pass(ctx, len(msgs)); err != nil {
				return err
			}
		}
		if e.Delay > 0 {
			sleepCtx(ctx, e.Delay)
		}
		failed := map[int]error{}
		var ok []*broker.Message
		for i, m := range msgs {
			if err := e.fail(m); err != nil {
				failed[i] = err
				continue
			}
			ok = append(ok, m)
		}
		if err := e.Ledger.InsertBatch()(ctx, ok); err != nil {
			return err
		}
		e.runs.Add(int64(len(ok)))
		if len(failed) > 0 {
			return &consumer.PartialError{Failed: failed}
		}
		return nil
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Gate holds handlers at their start while armed, so an outage can begin
// with work in flight: claims made, effects not yet run. Once the gate
// opens, the calls it held go on as follows: the 1st, 3rd, 5th... fail as
// unavailable (errGatedDown), so the consumer must hold them and its
// workers, free again, meet the outage with new claims (without this every
// worker could sit in a completion the guard retries for the whole outage,
// and the consumer would never see it); the 2nd, 6th, 10th... fail as plain
// handler errors (released in batch mode, retried in process in single
// mode); the others succeed, and their completions meet the outage.
type Gate struct {
	mu    sync.Mutex
	armed bool
	held  int // messages held
	calls int
	open  chan struct{}
}

// Arm makes handlers wait at the gate.
func (g *Gate) Arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.held, g.open = true, 0, make(chan struct{})
}

// Held is how many messages wait at the gate.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// Open lets the held handlers go on and disarms the gate.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed {
		g.armed = false
		close(g.open)
	}
}

func (g *Gate) pass(ctx context.Context, n int) error {
	g.mu.Lock()
	if !g.armed {
		g.mu.Unlock()
		return nil
	}
	g.held += n
	g.calls++
	call := g.calls
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return ctx.Err()
	}
	switch {
	case call%2 == 1:
		return errGatedDown
	case call%4 == 2:
		return errGated
	}
	return nil
}

// OutageReport is what a store outage hit.
type OutageReport struct {
	HeldAtStart int                   // messages claimed, effects not run, when the store went down
	Calls       map[faultstore.Op]int // store calls made (and refused) while it was down
	Lasted      time.Duration
}

// Claims is how many claims (single or batch calls) the store refused
// during the outage.
func (r OutageReport) Claims() int { return r.Calls[faultstore.OpClaim] + r.Calls[faultstore.OpBatch] }

func (r OutageReport) String() string {
	return fmt.Sprintf("%d messages in flight at its start, lasted %s, refused claim %d, batch claim %d, complete %d, complete-batch %d, extend %d, extend-batch %d, release %d",
		r.HeldAtStart, r.Lasted.Round(time.Millisecond), r.Calls[faultstore.OpClaim], r.Calls[faultstore.OpBatch], r.Calls[faultstore.OpComplete],
		r.Calls[faultstore.OpCompleteBatch], r.Calls[faultstore.OpExtend], r.Calls[faultstore.OpExtendBatch], r.Calls[faultstore.OpRelease])
}

// Outage arms the gate, waits until at least want messages are held there
// (claimed, effects not run), takes the store down, opens the gate (the
// effects run now; their completions, their heartbeats and the releases of
// those that fail meet the outage; those failing as unavailable are held,
// and their workers go on to claim others where the broker's ordering lets
// them) and brings the store back after d. It fails the test unless
// messages were in flight when the store went down and settles and lease
// extensions of them were refused. The caller checks that its consumer
// held deliveries (Stats.Holds grew across the call) and, where order keys
// are message keys, that claims were refused (on a broker ordered by
// partition, every partition may be waiting behind a held delivery).
func Outage(t testing.TB, fs *faultstore.Store, g *Gate, want int, d time.Duration) OutageReport {
	t.Helper()
	g.Arm()
	WaitFor(t, fmt.Sprintf("%d messages held at the gate", want), 2*time.Minute, func() (bool, string) {
		n := g.Held()
		return n >= want, fmt.Sprintf("%d held", n)
	})
	ops := []faultstore.Op{faultstore.OpClaim, faultstore.OpBatch, faultstore.OpComplete, faultstore.OpCompleteBatch, faultstore.OpExtend, faultstore.OpExtendBatch, faultstore.OpRelease}
	before := map[faultstore.Op]int{}
	for _, op := range ops {
		before[op] = fs.Calls(op)
	}
	fs.SetDown(true)
	start := time.Now()
	r := OutageReport{HeldAtStart: g.Held(), Calls: map[faultstore.Op]int{}}
	g.Open()
	time.Sleep(d)
	for _, op := range ops {
		r.Calls[op] = fs.Calls(op) - before[op]
	}
	fs.SetDown(false)
	r.Lasted = time.Since(start)
	// Every call is refused while the store is down. What must have been
	// tried: settling in-flight work (completions of the effects that ran,
	// releases of those that failed) and keeping its leases (extends).
	if r.HeldAtStart == 0 || r.Calls[faultstore.OpComplete]+r.Calls[faultstore.OpCompleteBatch]+r.Calls[faultstore.OpRelease] == 0 ||
		r.Calls[faultstore.OpExtend]+r.Calls[faultstore.OpExtendBatch] == 0 {
		t.Errorf("the outage did not hit in-flight work (no settle or no lease extension refused): %s", r)
	}
	return r
}

// Child environment: a consumer process started by StartChild.
const (
	envChild  = "IDEM_E2E_CHILD"  // the ledger's schema
	envParams = "IDEM_E2E_PARAMS" // adapter parameters, as the adapter wrote them
)

// ChildParams returns the parameters the parent passed to this child
// process, and false when this process is not a child.
func ChildParams() (schema, params string, ok bool) {
	schema = os.Getenv(envChild)
	return schema, os.Getenv(envParams), schema != ""
}

// Child is a consumer running in a process of its own, so the test can
// kill it with SIGKILL: nothing it holds is settled, no client says
// goodbye.
type Child struct {
	cmd  *exec.Cmd
	out  *strings.Builder
	done chan error
}

// StartChild re-runs this test binary with only test (a function that
// calls RunChild when ChildParams says so), for the ledger l and the
// adapter's params.
func StartChild(t testing.TB, test string, l *Ledger, params string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), envChild+"="+l.Schema, envParams+"="+params)
	c := &Child{cmd: cmd, out: &strings.Builder{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// Kill sends SIGKILL and waits for the process to be gone.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		t.Fatalf("child exited before the kill: %v\n%s", err, c.out)
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-c.done
	c.done <- err
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v\n%s", err, c.out)
	}
}

// ChildConfig is what the adapter's child test hands RunChild.
type ChildConfig struct {
	Subscriber      broker.Subscriber
	DeadLetter      broker.Publisher
	DeadLetterTopic string
	// Lease is the child guard's lease (0: the guard's default, 30s):
	// how long the parent waits for the keys the killed child held.
	Lease time.Duration
	// Store, when set, is the guard's store instead of a pgstore in the
	// ledger's schema: its records are not in the ledger's database, so
	// each effect is an autocommitted INSERT and its completion a separate
	// call, and a kill between the two would leave an effect the store
	// does not know of, which the next holder runs again (the at-least-once
	// window of a crash, docs/guard.md; not what these tests look for).
	// So the child applies only Apply effects (Apply > 0 is required) and
	// then holds every message it claims, running nothing, until it is
	// killed; poison messages are held from the start (a dead letter is
	// published apart from its record too). The parent kills it once
	// Ledger.WaitRecorded has seen all Apply effects recorded.
	Store idem.Store
	Apply int
}

// RunChild consumes in this (child) process until it is killed: single
// mode, the guard on pgstore in the parent's ledger schema (or on
// ChildConfig.Store) with its default lease (or ChildConfig.Lease), each
// effect committed with its claim's completion (kill safe; see
// ChildConfig.Store otherwise), 16 workers and 20ms per effect so claims
// are always in flight.
func RunChild(t *testing.T, cc ChildConfig) {
	schema, _, _ := ChildParams()
	l := OpenLedger(t, schema)
	var opts []idem.Option
	if cc.Lease > 0 {
		opts = append(opts, idem.WithLease(cc.Lease))
	}
	var eff *Effects
	var guard *idem.Guard
	if cc.Store != nil {
		if cc.Apply <= 0 {
			t.Fatal("e2etest: ChildConfig.Store needs Apply > 0")
		}
		guard = NewGuard(t, cc.Store, opts...)
		eff = &Effects{Ledger: l, Delay: 20 * time.Millisecond, Apply: int64(cc.Apply)}
	} else {
		st := OpenPGStore(t, l)
		guard = NewGuard(t, st, opts...)
		eff = &Effects{Ledger: l, Store: st, Delay: 20 * time.Millisecond}
	}
	cfg := FaultConsumerConfig(cc.Subscriber, guard, cc.DeadLetter, cc.DeadLetterTopic)
	cfg.Handler = eff.Handler()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t.Fatalf("child consumer returned before it was killed: %v", c.Run(ctx))
}

// FaultConsumerConfig is the fault scenario's consumer: the runtime's
// defaults except a one-second store-down delay (so an outage of 25s
// outlasts the 20 deliveries JetStream allows by default), poison messages
// to deadLetterTopic through dl, and a quiet logger.
func FaultConsumerConfig(sub broker.Subscriber, guard *idem.Guard, dl broker.Publisher, deadLetterTopic string) consumer.Config {
	return consumer.Config{
		Subscriber:      sub,
		Guard:           guard,
		DeadLetter:      dl,
		DeadLetterTopic: func(*broker.Message) string { return deadLetterTopic },
		StoreDownDelay:  time.Second,
		Logger:          Quiet(),
	}
}

// OpenPGStore is a pgstore in l's schema (records table idem_records),
// migrated if needed, closed at cleanup.
func OpenPGStore(t testing.TB, l *Ledger) *pgstore.Store {
	t.Helper()
	cfg := pgstore.Config{Pool: l.Pool, Schema: l.Schema, Table: "idem_records", Logger: Quiet()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgstore.Migrate(ctx, cfg); err != nil {
		t.Fatalf("pgstore migrate: %v", err)
	}
	s, err := pgstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// InProgress counts the keys in progress in the pgstore of l's schema,
// and of those the ones whose lease has ended.
func (l *Ledger) InProgress(t testing.TB) (inProgress, pastLease int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE lease_until < now()) FROM `+l.Schema+`.idem_records WHERE state = $1`,
		int16(idem.StateInProgress)).Scan(&inProgress, &pastLease); err != nil {
		t.Fatal(err)
	}
	return inProgress, pastLease
}

// InProgressIn counts the keys in progress in st, and of those the ones
// whose lease has ended.
func InProgressIn(t testing.TB, st idem.Lister) (inProgress, pastLease int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now, cursor := time.Now(), ""
	for {
		recs, next, err := st.ListInProgress(ctx, cursor, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			inProgress++
			if r.LeaseUntil.Before(now) {
				pastLease++
			}
		}
		if next == "" {
			return inProgress, pastLease
		}
		cursor = next
	}
}

// WaitRecorded waits until the ledger holds exactly apply rows, of apply
// distinct messages, and st has every one of them completed: a child
// stopped by ChildConfig.Apply has no effect left whose completion is
// still on its way, and may be killed.
func (l *Ledger) WaitRecorded(t testing.TB, st idem.Store, apply int) {
	t.Helper()
	recorded := map[string]bool{}
	WaitFor(t, fmt.Sprintf("the child to apply %d effects and record them", apply), 3*time.Minute, func() (bool, string) {
		ids := l.IDs(t)
		if len(ids) < apply {
			return false, fmt.Sprintf("%d rows", len(ids))
		}
		if len(ids) > apply {
			t.Fatalf("the ledger has %d rows, the child was to apply %d", len(ids), apply)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		left := 0
		for _, id := range ids {
			if recorded[id] {
				continue
			}
			r, err := st.Get(ctx, []byte(id))
			switch {
			case err == nil && r.State == idem.StateCompleted:
				recorded[id] = true
			case err == nil || errors.Is(err, idem.ErrNotFound):
				left++
			default:
				t.Fatalf("get %s: %v", id, err)
			}
		}
		return left == 0, fmt.Sprintf("%d rows, %d not completed in the store yet", len(ids), left)
	})
}

// IDs returns the message id of every ledger row.
func (l *Ledger) IDs(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := l.Pool.Query(ctx, `SELECT msg_id FROM `+l.Table)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// CheckFaultRun fails the test unless the ledger holds every message
// 0..n-1 that is not poison exactly once with its own payload and no
// other row, the dead-letter messages dl are exactly the poison messages,
// once each, and no key in the store (the pgstore in l's schema) is in
// progress past its lease.
func (l *Ledger) CheckFaultRun(t testing.TB, n int, dl []*broker.Message) {
	t.Helper()
	l.checkFaultRun(t, n, dl, func() (int, int) { return l.InProgress(t) })
}

// CheckFaultRunOn is CheckFaultRun for a run whose records are in st.
func (l *Ledger) CheckFaultRunOn(t testing.TB, n int, dl []*broker.Message, st idem.Lister) {
	t.Helper()
	l.checkFaultRun(t, n, dl, func() (int, int) { return InProgressIn(t, st) })
}

func (l *Ledger) checkFaultRun(t testing.TB, n int, dl []*broker.Message, inProgress func() (int, int)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := l.Pool.Query(ctx, `SELECT msg_id, payload FROM `+l.Table)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var problems []string
	wrong, unknown := 0, 0
	for rows.Next() {
		var id string
		var p []byte
		if err := rows.Scan(&id, &p); err != nil {
			t.Fatal(err)
		}
		count[id]++
		i, ok := Index(id)
		switch {
		case !ok || i >= n:
			unknown++
		case string(p) != string(Payload(i)):
			wrong++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	missing, twice, poisonRun := 0, 0, 0
	var example string
	for i := range n {
		c := count[ID(i)]
		switch {
		case Poison(i) && c > 0:
			poisonRun++
		case Poison(i):
		case c == 0:
			missing++
		case c > 1:
			twice++
			if example == "" {
				example = fmt.Sprintf("%s x%d", ID(i), c)
			}
		}
	}
	for what, k := range map[string]int{"ids are missing": missing, "ids are there more than once (e.g. " + example + ")": twice,
		"poison messages had an effect": poisonRun, "rows carry an id that was never published": unknown, "rows carry another message's payload": wrong} {
		if k > 0 {
			problems = append(problems, fmt.Sprintf("%d %s", k, what))
		}
	}
	dead := map[string]int{}
	for _, m := range dl {
		dead[m.Headers[consumer.HeaderOriginalID]]++
	}
	for i := range n {
		if c := dead[ID(i)]; Poison(i) && c != 1 {
			problems = append(problems, fmt.Sprintf("poison message %s dead-lettered %d times", ID(i), c))
		} else if !Poison(i) && c > 0 {
			problems = append(problems, fmt.Sprintf("message %s dead-lettered %d times", ID(i), c))
		}
	}
	if in, past := inProgress(); past > 0 {
		problems = append(problems, fmt.Sprintf("%d keys in progress past their lease (%d in progress)", past, in))
	}
	if len(problems) > 0 {
		t.Fatalf("not exactly once: %s", strings.Join(problems, "; "))
	}
}

// Poisons is how many of 0..n-1 are poison.
func Poisons(n int) int {
	k := 0
	for i := range n {
		if Poison(i) {
			k++
		}
	}
	return k
}

// ReadN fetches want messages from sub, acking each, and fails the test
// if they do not all come before ctx ends.
func ReadN(ctx context.Context, t testing.TB, sub broker.Subscriber, want int) []*broker.Message {
	t.Helper()
	var out []*broker.Message
	for len(out) < want {
		msgs, err := sub.Fetch(ctx, want-len(out))
		if err != nil {
			t.Fatalf("read %d of %d: %v", len(out), want, err)
		}
		for _, m := range msgs {
			_ = m.Acker.Ack(ctx)
		}
		out = append(out, msgs...)
	}
	return out
}
