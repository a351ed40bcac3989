package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/chaos/internal/crashplan"
	"github.com/idem-dev/idem/chaos/internal/remotestore"
	"github.com/idem-dev/idem/chaos/internal/shm"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
)

// MaybeWorker runs the worker role named by IDEM_CHAOS_ROLE and exits; in
// any other process it returns at once. Call it first thing in main (and
// in TestMain): the harness starts its consumers, relays and store server
// by re-executing its own binary with that variable set.
func MaybeWorker() {
	role := os.Getenv(EnvRole)
	if role == "" {
		return
	}
	if err := runWorker(role); err != nil {
		fmt.Fprintf(os.Stderr, "chaos %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runWorker(role string) error {
	spec, err := readSpec()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	switch role {
	case RoleStore:
		return runStoreServer(ctx, spec)
	case RoleConsumer:
		return runConsumer(ctx, spec, log)
	case RoleRelay:
		return runRelay(ctx, spec, log)
	}
	return fmt.Errorf("unknown role %q", role)
}

// runStoreServer serves the embedded store (boltstore) to the consumers
// until SIGTERM.
func runStoreServer(ctx context.Context, spec Spec) error {
	st, err := boltstore.Open(boltstore.Config{Path: spec.Store.Path})
	if err != nil {
		return err
	}
	defer st.Close()
	ln, err := net.Listen("tcp", os.Getenv(EnvListen))
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	err = remotestore.Serve(ln, st)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// control reads the harness's commands on stdin: "clock <duration>" sets
// the fake clock's offset; "stop", or stdin closing (the harness died),
// ends the worker gracefully.
func control(stop context.CancelFunc, clock *offsetClock, ctr *shm.File) {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "clock":
			if d, err := time.ParseDuration(f[1]); err == nil && clock != nil {
				clock.off.Store(int64(d))
				ctr.Set(shm.ClockOffset, d.Milliseconds())
			}
		case len(f) == 1 && f[0] == "stop":
			stop()
		}
	}
	stop()
}

// offsetClock is the consumer host's clock, stepped by the harness: the
// guard reads it (idem.WithClock); the stores keep their own clocks. The
// machine's clock is never changed (it would hit every process on it).
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// crasher kills this process at a named crash point, the n-th time it is
// reached, after writing what it held into the counters.
type crasher struct {
	ctr   *shm.File
	plan  map[string]int64
	count map[string]*atomic.Int64
}

func newCrasher(ctr *shm.File) (*crasher, error) {
	plan, err := crashplan.Parse(os.Getenv(EnvCrash))
	if err != nil {
		return nil, err
	}
	c := &crasher{ctr: ctr, plan: plan, count: map[string]*atomic.Int64{}}
	for p := range plan {
		c.count[p] = new(atomic.Int64)
	}
	return c, nil
}

func (c *crasher) at(point string) {
	n, ok := c.plan[point]
	if !ok || c.count[point].Add(1) != n {
		return
	}
	c.ctr.Set(shm.CrashHeld, c.ctr.Get(shm.InHandler))
	c.ctr.Set(shm.CrashUnsettled, c.ctr.Get(shm.Unsettled))
	c.ctr.Set(shm.CrashPoint, crashplan.Codes[point])
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns: nothing after the crash point runs
}

// openCounters maps the worker's counter file, records its pid and arms
// its crash points.
func openCounters(spec Spec) (*shm.File, *crasher, error) {
	ctr, err := shm.Open(spec.Shm)
	if err != nil {
		return nil, nil, err
	}
	ctr.Set(shm.Pid, int64(os.Getpid()))
	crash, err := newCrasher(ctr)
	return ctr, crash, err
}

func runConsumer(ctx context.Context, spec Spec, log *slog.Logger) error {
	ctr, crash, err := openCounters(spec)
	if err != nil {
		return err
	}
	clock := &offsetClock{}
	if s := os.Getenv(EnvClock); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%s: %w", EnvClock, err)
		}
		clock.off.Store(int64(d))
		ctr.Set(shm.ClockOffset, d.Milliseconds())
	}
	// The store may be restarting or cut off when this process starts
	// (it replaces one that died during a fault): retry until it opens.
	var st *storeConn
	if err := retry(ctx, func() (err error) {
		st, err = openStore(ctx, spec, spec.Store.Addr)
		return err
	}); err != nil {
		return err
	}
	defer st.close()
	pool, err := newPool(ctx, spec.LedgerURL, 16)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Closed after the guard (deferred before it): the guard's last
	// background answers are recorded too.
	events := newGuardEvents(pool, spec.Schema, os.Getpid())
	defer events.close()
	hooks := idem.Hooks{
		OnClaim: func(_ context.Context, e idem.ClaimEvent) {
			switch {
			case e.Err != nil:
				ctr.Add(shm.ClaimErrors, 1)
			case e.Outcome == idem.OutcomeAcquired:
				ctr.Add(shm.Claims, 1)
			}
		},
	}
	opts := []idem.Option{idem.WithClock(clock), idem.WithHooks(hooks, events.hooks(func() { ctr.Add(shm.LeaseLost, 1) })), idem.WithLogger(log)}
	if spec.Timing.Lease > 0 {
		opts = append(opts, idem.WithLease(time.Duration(spec.Timing.Lease)))
	}
	guard, err := idem.NewGuard(st.store, opts...)
	if err != nil {
		return err
	}
	defer guard.Close()
	b, err := openBroker(ctx, spec.Broker, log)
	if err != nil {
		return err
	}
	defer b.close()
	sub, err := b.subscriber(ctx, spec.Broker, spec.Timing)
	if err != nil {
		return err
	}
	dl, err := b.publisher(true)
	if err != nil {
		return err
	}
	ran := new(sync.Map)
	eff := &effect{spec: spec, ctr: ctr, crash: crash, ran: ran, pid: os.Getpid(), st: st}
	eff.pool, eff.ledgerPool = pool, pool
	if spec.Effect == EffectTx {
		eff.pool = st.pool
	}
	cfg := consumer.Config{
		Subscriber:      wrapSubscriber(sub, ctr, crash, ran),
		Guard:           guard,
		Handler:         eff.handle,
		DeadLetter:      dl,
		DeadLetterTopic: func(*broker.Message) string { return spec.Broker.DLQ },
		Hooks:           consumer.Hooks{OnUnrecorded: eff.unrecorded},
		Workers:         spec.Workers,
		Logger:          log,
	}
	if spec.Batch > 0 {
		if err := eff.batchHandlers(&cfg, spec); err != nil {
			return err
		}
	}
	if d := spec.Timing.StoreDownDelay; d > 0 {
		cfg.StoreDownDelay = time.Duration(d)
	}
	if d := spec.Timing.InProgressInterval; d > 0 {
		cfg.InProgressInterval = time.Duration(d)
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go control(stopRun, clock, ctr)
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			s := c.Stats()
			ctr.Set(shm.StoreErrors, s.StoreErrors)
			ctr.Set(shm.Duplicates, s.Duplicates)
			ctr.Set(shm.Naked, s.Naked)
			ctr.Set(shm.DeadLettered, s.DeadLettered)
			ctr.Set(shm.Handled, s.Handled)
			ctr.Set(shm.Unrecorded, s.Unrecorded)
			ctr.Set(shm.Alive, time.Now().UnixMilli())
			select {
			case <-t.C:
			case <-runCtx.Done():
				return
			}
		}
	}()
	ctr.Set(shm.Ready, 1)
	err = c.Run(runCtx)
	s := c.Stats()
	ctr.Set(shm.Duplicates, s.Duplicates)
	ctr.Set(shm.Handled, s.Handled)
	ctr.Set(shm.DeadLettered, s.DeadLettered)
	ctr.Set(shm.Ready, 2)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// wrapSubscriber counts deliveries and their settling, and fires the
// after-complete crash point before the ack of a message whose effect
// this process applied. It keeps the broker.DeliveryLimiter capability.
func wrapSubscriber(sub broker.Subscriber, ctr *shm.File, crash *crasher, ran *sync.Map) broker.Subscriber {
	cs := &countingSub{Subscriber: sub, ctr: ctr, crash: crash, ran: ran}
	if l, ok := sub.(broker.DeliveryLimiter); ok {
		return limitedSub{cs, l}
	}
	return cs
}

type limitedSub struct {
	*countingSub
	broker.DeliveryLimiter
}

type countingSub struct {
	broker.Subscriber
	ctr   *shm.File
	crash *crasher
	ran   *sync.Map
}

func (s *countingSub) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	msgs, err := s.Subscriber.Fetch(ctx, max)
	s.ctr.Add(shm.Fetched, int64(len(msgs)))
	s.ctr.Add(shm.Unsettled, int64(len(msgs)))
	for _, m := range msgs {
		m.Acker = &countingAcker{Acker: m.Acker, s: s, m: m}
	}
	return msgs, err
}

type countingAcker struct {
	broker.Acker
	s    *countingSub
	m    *broker.Message
	done atomic.Bool
}

func (a *countingAcker) settled() {
	if a.done.CompareAndSwap(false, true) {
		a.s.ctr.Add(shm.Unsettled, -1)
	}
}

func (a *countingAcker) Ack(ctx context.Context) error {
	if _, ran := a.s.ran.LoadAndDelete(a.m); ran {
		a.s.crash.at(AfterComplete)
	}
	err := a.Acker.Ack(ctx)
	a.s.ctr.Add(shm.Acks, 1)
	a.settled()
	return err
}

// InProgress: a delivery the broker reports lost (broker.ErrDeliveryLost)
// is no longer this process's: the consumer drops it with no broker call
// (the broker redelivers it), so it is settled here, or the drain would
// wait for it for ever.
func (a *countingAcker) InProgress(ctx context.Context) error {
	err := a.Acker.InProgress(ctx)
	if errors.Is(err, broker.ErrDeliveryLost) {
		a.s.ran.Delete(a.m)
		a.settled()
	}
	return err
}

func (a *countingAcker) Nak(ctx context.Context, d time.Duration) error {
	a.s.ran.Delete(a.m)
	err := a.Acker.Nak(ctx, d)
	a.settled()
	return err
}

func (a *countingAcker) Term(ctx context.Context, reason string) error {
	a.s.ran.Delete(a.m)
	err := a.Acker.Term(ctx, reason)
	a.settled()
	return err
}

func runRelay(ctx context.Context, spec Spec, log *slog.Logger) error {
	ctr, crash, err := openCounters(spec)
	if err != nil {
		return err
	}
	pool, err := newPool(ctx, spec.LedgerURL, 8)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := pgoutbox.New(pgoutbox.Config{Pool: pool, Schema: spec.Schema, Table: "outbox", Logger: log})
	if err != nil {
		return err
	}
	b, err := openBroker(ctx, spec.Broker, log)
	if err != nil {
		return err
	}
	defer b.close()
	pub, err := b.publisher(true)
	if err != nil {
		return err
	}
	r, err := outbox.New(outbox.Config{
		Backend:   countingBackend{Outbox: ob, ctr: ctr},
		Publisher: &crashPublisher{Publisher: pub, ctr: ctr, crash: crash},
		Logger:    log,
		Hooks: outbox.Hooks{
			OnError: func(context.Context, string, error) { ctr.Add(shm.RelayErrors, 1) },
			OnRetry: func(context.Context, outbox.RetryEvent) { ctr.Add(shm.RelayErrors, 1) },
		},
	})
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go control(stopRun, nil, ctr)
	ctr.Set(shm.Ready, 1)
	err = r.Run(runCtx)
	ctr.Set(shm.Ready, 2)
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// crashPublisher fires the after-publish crash point once the broker has
// accepted a batch and before the relay marks its rows sent.
type crashPublisher struct {
	broker.Publisher
	ctr   *shm.File
	crash *crasher
}

func (p *crashPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := p.Publisher.Publish(ctx, msgs...); err != nil {
		return err
	}
	p.ctr.Add(shm.RelayPublished, int64(len(msgs)))
	p.crash.at(AfterPublish)
	return nil
}

// countingBackend counts the rows a relay holds (claimed, not settled),
// keeping the Notifier capability of pgoutbox.
type countingBackend struct {
	*pgoutbox.Outbox
	ctr *shm.File
}

func (b countingBackend) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.Batch, error) {
	bt, err := b.Outbox.Claim(ctx, req)
	if err != nil {
		return bt, err
	}
	n := int64(len(bt.Rows()))
	b.ctr.Add(shm.RelayClaimed, n)
	return &countingBatch{Batch: bt, ctr: b.ctr, n: n}, nil
}

type countingBatch struct {
	outbox.Batch
	ctr  *shm.File
	n    int64
	done atomic.Bool
}

func (b *countingBatch) end() {
	if b.done.CompareAndSwap(false, true) {
		b.ctr.Add(shm.RelayClaimed, -b.n)
	}
}

func (b *countingBatch) Settle(ctx context.Context, s outbox.Settlement) error {
	defer b.end()
	return b.Batch.Settle(ctx, s)
}

func (b *countingBatch) Release(ctx context.Context) error {
	defer b.end()
	return b.Batch.Release(ctx)
}
