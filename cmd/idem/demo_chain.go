package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"
	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
	"github.com/idem-dev/idem/boltstore/boltoutbox"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/outbox"
)

// The chain's names and timing. The broker's ack wait and the guard's
// lease are short so that a crashed consumer's work comes back within
// seconds; the heartbeat and in-progress signals keep live work far from
// both.
const (
	demoStream       = "DEMO"
	demoSubject      = "demo.orders"
	demoGroup        = "charges"
	demoReplayGroup  = "charges-after-restart"
	demoAckWait      = 2 * time.Second
	demoLease        = 5 * time.Second
	demoEnqueuedHdr  = "demo-enqueued-unix-nano"
	demoProduceBatch = 100
)

var (
	bOrders = []byte("orders") // id -> payload, written with the outbox row
	bLedger = []byte("ledger") // seq -> id, one row per applied effect
	bFence  = []byte("fence")  // id -> token(8) process(4) of the last holder that applied it
)

var errCrashed = fmt.Errorf("%w: demo: this consumer process has crashed", idem.ErrUnavailable)

// demoRun is one run's shared state.
type demoRun struct {
	c     demoConfig
	quiet *slog.Logger

	app   *bbolt.DB
	store *boltstore.Store
	js    jetstream.JetStream
	url   string

	// counters
	deliveries, lostAcks, dupPublishes   atomic.Int64
	pubBatches, lostPubAcks, republished atomic.Int64 // relay batches; those whose ack was lost; their messages
	fenced, reruns, unexplained, handled atomic.Int64
	pendingCopies                        sync.WaitGroup
	copies                               atomic.Int64 // copies scheduled, not yet published

	mu        sync.Mutex
	delivered map[string]int32  // deliveries per message id
	copied    map[string]bool   // ids scheduled for a second publish
	latency   []time.Duration   // fetch -> ack per acked delivery
	e2e       []time.Duration   // outbox commit -> first effect
	procs     []*demoProc       // running (or crashed and winding down) in this phase
	byID      map[int]*demoProc // every process of the run
	faultOnce sync.Once
}

// chance is a deterministic draw in [0, 1) for (what, id, n): which
// messages the faults hit is a function of -seed, not of scheduling.
func (r *demoRun) chance(what, id string, n int) float64 {
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(n))
	binary.LittleEndian.PutUint64(b[8:], r.c.seed)
	h.Write(b[:])
	h.Write([]byte(what))
	h.Write([]byte(id))
	x := h.Sum64() // mixed once more (splitmix64's finalizer): FNV's low bits are weak
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

func runDemo(c demoConfig, out, progress io.Writer) (demoReport, error) {
	rep := demoReport{Messages: c.messages}
	start := time.Now()
	r := &demoRun{
		c: c, quiet: slog.New(slog.NewTextHandler(io.Discard, nil)),
		delivered: map[string]int32{}, copied: map[string]bool{}, byID: map[int]*demoProc{},
	}
	printDemoHeader(out, c)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()

	// The broker: an embedded NATS server with JetStream on disk.
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: filepath.Join(c.dir, "jetstream"),
		NoLog: true, NoSigs: true, ServerName: "idem-demo",
	})
	if err != nil {
		return rep, fmt.Errorf("embedded NATS server: %w", err)
	}
	go ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		return rep, errors.New("embedded NATS server not ready within 10s")
	}
	r.url = ns.ClientURL()
	nc, err := nats.Connect(r.url, nats.Name("idem-demo-relay"))
	if err != nil {
		return rep, err
	}
	defer nc.Close()
	if r.js, err = jetstream.New(nc); err != nil {
		return rep, err
	}
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: demoStream, Subjects: []string{demoSubject}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		return rep, fmt.Errorf("stream: %w", err)
	}

	// The application's file (orders, outbox, ledger) and the guard's.
	if r.app, err = bbolt.Open(filepath.Join(c.dir, "app.db"), 0o600, &bbolt.Options{Timeout: time.Second}); err != nil {
		return rep, err
	}
	defer r.app.Close()
	if err := r.app.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bOrders, bLedger, bFence} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return rep, err
	}
	ob, err := boltoutbox.New(boltoutbox.Config{DB: r.app})
	if err != nil {
		return rep, err
	}
	idemPath := filepath.Join(c.dir, "idem.db")
	if r.store, err = boltstore.Open(boltstore.Config{Path: idemPath, Logger: r.quiet}); err != nil {
		return rep, err
	}
	defer func() { r.store.Close() }()

	// Producer and relay.
	pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: r.js, Logger: r.quiet})
	if err != nil {
		return rep, err
	}
	raw, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: r.js, NoDedup: true, Logger: r.quiet})
	if err != nil {
		return rep, err
	}
	relay, err := outbox.New(outbox.Config{
		Backend: ob, Publisher: &demoPublisher{r: r, pub: pub, raw: raw},
		BatchSize: 64, Concurrency: 2, MaxAttempts: outbox.Unlimited, StatsInterval: -1, Logger: r.quiet,
		Backoff: outbox.Backoff{Initial: 100 * time.Millisecond, Max: time.Second},
	})
	if err != nil {
		return rep, err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { relay.Run(relayCtx); close(relayDone) }()
	defer func() { stopRelay(); <-relayDone }()
	produced := make(chan error, 1)
	go func() { produced <- r.produce(ctx, ob) }()

	// Phase 1: consumer processes on one group; some crash and are replaced.
	bar := newDemoBar(progress, int64(c.messages), "outbox -> NATS -> consumers")
	for range c.consumers {
		if _, err := r.startProc(ctx, demoGroup, r.store); err != nil {
			return rep, err
		}
	}
	crashAt := make([]int64, c.crashes)
	for i := range crashAt {
		crashAt[i] = int64(c.messages) * int64(i+1) / int64(c.crashes+1)
	}
	var abandoned int64
	crashed := 0
	var produceErr error
	producing := true
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var drained time.Time
	for drained.IsZero() {
		select {
		case <-ctx.Done():
		case produceErr = <-produced:
			producing = false
			if produceErr != nil {
				cancel()
			}
			continue
		case <-tick.C:
		}
		if ctx.Err() != nil {
			break
		}
		done := r.handled.Load()
		bar.set(done)
		if crashed < len(crashAt) && done >= crashAt[crashed] {
			n, err := r.crashOne(ctx)
			if err != nil {
				return rep, err
			}
			abandoned += n
			crashed++
		}
		if producing || done < int64(c.messages) || crashed < len(crashAt) {
			continue
		}
		if idle, err := r.drained(ctx, ob, demoGroup); err != nil {
			return rep, err
		} else if idle {
			drained = time.Now()
		}
	}
	bar.finish()
	if produceErr != nil {
		return rep, fmt.Errorf("producer: %w", produceErr)
	}
	timedOut := drained.IsZero()
	if timedOut {
		drained = time.Now()
	}
	phase1 := r.stopProcs()
	stopRelay()
	<-relayDone
	r.pendingCopies.Wait()
	p1Deliveries := r.deliveries.Load()
	p1Effects, _, _, err := r.countLedger()
	if err != nil {
		return rep, err
	}
	elapsed1 := drained.Sub(start)

	// Phase 2: the consumers' host restarts: the store is closed and
	// opened again from its file, and a new consumer group reads the whole
	// stream from the start (a group reset, a replay after a rebalance).
	var p2 demoPhase
	var p2Deliveries, p2Effects int64
	var elapsed2 time.Duration
	if !timedOut {
		if err := r.store.Close(); err != nil {
			return rep, err
		}
		if r.store, err = boltstore.Open(boltstore.Config{Path: idemPath, Logger: r.quiet}); err != nil {
			return rep, fmt.Errorf("reopen %s: %w", idemPath, err)
		}
		si, err := r.js.Stream(ctx, demoStream)
		if err != nil {
			return rep, err
		}
		info, err := si.Info(ctx)
		if err != nil {
			return rep, err
		}
		inStream := int64(info.State.Msgs)
		bar = newDemoBar(progress, inStream, "restart: new group replays all")
		start2 := time.Now()
		for range c.consumers {
			if _, err := r.startProc(ctx, demoReplayGroup, r.store); err != nil {
				return rep, err
			}
		}
		for {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
			if ctx.Err() != nil {
				timedOut = true
				break
			}
			n := r.deliveries.Load() - p1Deliveries
			bar.set(min(n, inStream))
			if n < inStream {
				continue
			}
			if idle, err := r.drained(ctx, nil, demoReplayGroup); err != nil {
				return rep, err
			} else if idle {
				break
			}
		}
		elapsed2 = time.Since(start2)
		bar.finish()
		p2 = r.stopProcs()
		p2Deliveries = r.deliveries.Load() - p1Deliveries
		total, _, _, err := r.countLedger()
		if err != nil {
			return rep, err
		}
		p2Effects = total - p1Effects
	}

	// The check: the ledger against the messages produced.
	effects, dupEffects, lost, err := r.countLedger()
	if err != nil {
		return rep, err
	}
	dupEffects += r.unexplained.Load()
	r.mu.Lock()
	distinct := int64(len(r.delivered))
	lat := slices.Clone(r.latency)
	e2e := slices.Clone(r.e2e)
	r.mu.Unlock()
	rep.Deliveries = r.deliveries.Load()
	rep.DuplicatesDelivered = rep.Deliveries - distinct
	rep.Effects, rep.DuplicateEffects, rep.Lost = effects, dupEffects, lost
	rep.MsgsPerSec = float64(c.messages) / elapsed1.Seconds()
	rep.P50Ms, rep.P99Ms = pctMs(lat, 0.50), pctMs(lat, 0.99)
	rep.EndToEndP99Ms = pctMs(e2e, 0.99)
	rep.Replays = phase1.replays + p2.replays
	rep.DuplicatePublishes = r.dupPublishes.Load()
	rep.LostPublishAcks = r.lostPubAcks.Load()
	rep.LostAcks = r.lostAcks.Load()
	rep.Crashes = crashed
	rep.AbandonedDeliveries = abandoned
	rep.RerunsAfterCrash = r.reruns.Load()
	rep.ReplayPhaseEffects, rep.ReplayPhaseDelivered = p2Effects, p2Deliveries
	rep.ElapsedSeconds = time.Since(start).Seconds()
	rep.ExactlyOnce = !timedOut && lost == 0 && dupEffects == 0

	const row = "%-32s %10v %8v %8v %16v %9v %7v %7v\n"
	fmt.Fprintf(out, row, "phase", "deliveries", "replays", "effects", "in-progress naks", "lost acks", "crashes", "msgs/s")
	fmt.Fprintf(out, row, "run", p1Deliveries, phase1.replays, p1Effects, phase1.naks, phase1.lostAcks, crashed, int(rep.MsgsPerSec))
	if !timedOut {
		fmt.Fprintf(out, row, "restart, new group replays all", p2Deliveries, p2.replays, p2Effects, p2.naks, p2.lostAcks, 0, int(float64(p2Deliveries)/elapsed2.Seconds()))
	}
	fmt.Fprintf(out, "\nproducer: %d of %d relay batches (%d messages) published again after a lost publish ack (the stream's dedup window dropped the copies); %d messages published twice past it\n",
		rep.LostPublishAcks, r.pubBatches.Load(), r.republished.Load(), rep.DuplicatePublishes)
	fmt.Fprintf(out, "crashes: %d consumer processes died holding %d deliveries; %d effects they applied without completing the claim were found by the next holder (fence row) and not applied again\n",
		crashed, abandoned, rep.RerunsAfterCrash)
	fmt.Fprintf(out, "latency: delivery -> ack p50 %.1f ms, p99 %.1f ms; outbox commit -> effect p99 %.0f ms\n", rep.P50Ms, rep.P99Ms, rep.EndToEndP99Ms)
	fmt.Fprintf(out, "ledger: %d effects for %d messages (%d deliveries, %d of them duplicates): %d lost, %d applied more than once\n",
		effects, c.messages, rep.Deliveries, rep.DuplicatesDelivered, lost, dupEffects)
	switch {
	case timedOut:
		return rep, fmt.Errorf("not drained within -timeout %s", c.timeout)
	case !rep.ExactlyOnce:
		fmt.Fprintln(out, "EXACTLY-ONCE VIOLATED")
		return rep, errors.New("exactly-once violated")
	}
	fmt.Fprintf(out, "every message's effect happened exactly once (%.1f s)\n", rep.ElapsedSeconds)
	return rep, nil
}

// produce commits the messages into the outbox, demoProduceBatch per
// transaction, each with its order row: the business change and the
// message commit together or not at all.
func (r *demoRun) produce(ctx context.Context, ob *boltoutbox.Outbox) error {
	for i := 0; i < r.c.messages; i += demoProduceBatch {
		err := r.app.Update(func(tx *bbolt.Tx) error {
			orders := tx.Bucket(bOrders)
			now := strconv.FormatInt(time.Now().UnixNano(), 10)
			var msgs []outbox.Message
			for j := i; j < min(i+demoProduceBatch, r.c.messages); j++ {
				id := fmt.Sprintf("order-%07d", j)
				payload := fmt.Appendf(nil, `{"order":%d,"amount_cents":%d}`, j, 100+j%9900)
				if err := orders.Put([]byte(id), payload); err != nil {
					return err
				}
				msgs = append(msgs, outbox.Message{ID: id, Topic: demoSubject, Payload: payload, Headers: map[string]string{demoEnqueuedHdr: now}})
			}
			_, err := ob.Enqueue(ctx, tx, msgs...)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// drained reports that nothing is left anywhere: the outbox is empty (when
// ob is given), every second publish is out, and the group has nothing
// pending or unacked.
func (r *demoRun) drained(ctx context.Context, ob *boltoutbox.Outbox, group string) (bool, error) {
	if ob != nil {
		st, err := ob.Stats(ctx)
		if err != nil {
			return false, err
		}
		if st.Pending > 0 || st.Failed > 0 {
			return false, nil
		}
	}
	if r.copies.Load() > 0 {
		return false, nil
	}
	cons, err := r.js.Consumer(ctx, demoStream, group)
	if err != nil {
		return false, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}

// countLedger counts effects: rows, rows beyond one per message, and
// messages without a row.
func (r *demoRun) countLedger() (effects, dup, lost int64, err error) {
	counts := make(map[string]int, r.c.messages)
	err = r.app.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bLedger).ForEach(func(_, v []byte) error {
			counts[string(v)]++
			effects++
			return nil
		})
	})
	for i := range r.c.messages {
		switch n := counts[fmt.Sprintf("order-%07d", i)]; {
		case n == 0:
			lost++
		case n > 1:
			dup += int64(n - 1)
		}
	}
	return effects, dup, lost, err
}

// demoPublisher is the relay's publisher with the producer-side faults: a
// lost publish ack for a fraction of the batches (the broker has the
// batch, the relay hears an error and publishes it again: the stream's
// dedup window drops the copies), and a
// second publish of some messages past the dedup window (a producer retry
// much later: the broker delivers both).
type demoPublisher struct {
	r        *demoRun
	pub, raw broker.Publisher
}

func (p *demoPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := p.pub.Publish(ctx, msgs...); err != nil {
		return err
	}
	r := p.r
	for _, m := range msgs {
		if r.chance("dup", m.ID, 0) >= r.c.dupRate {
			continue
		}
		r.mu.Lock()
		again := r.copied[m.ID]
		r.copied[m.ID] = true
		r.mu.Unlock()
		if again {
			continue
		}
		cp := *m
		cp.Headers = maps.Clone(m.Headers)
		delay := time.Duration(r.chance("dup-delay", m.ID, 0) * float64(1500*time.Millisecond))
		r.copies.Add(1)
		r.pendingCopies.Add(1)
		time.AfterFunc(delay, func() {
			defer r.pendingCopies.Done()
			defer r.copies.Add(-1)
			pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if p.raw.Publish(pctx, &cp) == nil {
				r.dupPublishes.Add(1)
			}
		})
	}
	// Batch n loses its ack when n*rate crosses an integer: the first
	// batch, then one in 1/rate, whatever the batches hold.
	n := float64(r.pubBatches.Add(1))
	if math.Ceil(n*r.c.lostPubAcks) > math.Ceil((n-1)*r.c.lostPubAcks) {
		// The relay publishes the batch again; the copies carry the same
		// Nats-Msg-Id and the stream's dedup window drops them.
		r.lostPubAcks.Add(1)
		r.republished.Add(int64(len(msgs)))
		return errors.New("demo: publish ack lost")
	}
	return nil
}

func (p *demoPublisher) Close() error { return nil }

// demoPhase sums the consumer processes' counters of one phase.
type demoPhase struct{ replays, naks, lostAcks int64 }

// demoProc is one consumer "process": its own NATS connection, subscriber,
// guard and consumer runtime. crash makes it die abruptly: from that
// instant none of its store calls, broker calls or effects goes through,
// so its deliveries stay unsettled and its claims unfinished, as when a
// process is killed.
type demoProc struct {
	id       int
	r        *demoRun
	dead     atomic.Bool
	nc       *nats.Conn
	guard    *idem.Guard
	cons     *consumer.Consumer
	stop     context.CancelFunc
	done     chan struct{}
	lostAcks atomic.Int64
	inFlight atomic.Int64 // handlers running
}

func (r *demoRun) startProc(ctx context.Context, group string, store idem.Store) (*demoProc, error) {
	r.mu.Lock()
	p := &demoProc{id: len(r.byID) + 1, r: r, done: make(chan struct{})}
	r.procs = append(r.procs, p)
	r.byID[p.id] = p
	r.mu.Unlock()
	var err error
	if p.nc, err = nats.Connect(r.url, nats.Name(fmt.Sprintf("idem-demo-consumer-%d", p.id))); err != nil {
		return nil, err
	}
	js, err := jetstream.New(p.nc)
	if err != nil {
		return nil, err
	}
	sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{
		JS: js, Stream: demoStream, Durable: group, AckWait: demoAckWait, PollWait: time.Second, Logger: r.quiet,
	})
	if err != nil {
		return nil, err
	}
	if p.guard, err = idem.NewGuard(&crashableStore{Store: store, p: p}, idem.WithLease(demoLease), idem.WithTTL(24*time.Hour), idem.WithLogger(r.quiet)); err != nil {
		return nil, err
	}
	p.cons, err = consumer.New(consumer.Config{
		Subscriber: &demoSubscriber{Subscriber: sub, p: p}, Guard: p.guard, Handler: p.handle,
		Workers: r.c.workers, MaxInFlight: 256, FetchBatch: 64,
		InProgressInterval: demoAckWait / 4, ShutdownTimeout: 3 * time.Second,
		Backoff: consumer.Backoff{Initial: 50 * time.Millisecond, Max: time.Second, Multiplier: 2},
		Logger:  r.quiet,
	})
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.stop = stop
	go func() {
		defer close(p.done)
		p.cons.Run(rctx)
		sub.Close()
		p.guard.Close()
		p.nc.Close()
	}()
	return p, nil
}

// crashOne kills the live process holding the most deliveries and starts
// a replacement. It returns how many deliveries the dead one abandoned.
func (r *demoRun) crashOne(ctx context.Context) (int64, error) {
	r.mu.Lock()
	var victim *demoProc
	for _, p := range r.procs {
		if !p.dead.Load() && (victim == nil || p.cons.Stats().InFlight > victim.cons.Stats().InFlight) {
			victim = p
		}
	}
	r.mu.Unlock()
	if victim == nil {
		return 0, nil
	}
	abandoned := victim.crash()
	_, err := r.startProc(ctx, demoGroup, r.store)
	return abandoned, err
}

// crash: from now on every call of this process fails, its connection is
// closed with its deliveries unsettled, and its runtime is left to wind
// down in the background against walls it cannot pass.
func (p *demoProc) crash() int64 {
	p.dead.Store(true)
	abandoned := p.cons.Stats().InFlight
	p.nc.Close()
	p.stop()
	return abandoned
}

// stopProcs stops every live process gracefully, waits for every process
// (crashed ones included) and sums their counters.
func (r *demoRun) stopProcs() demoPhase {
	r.mu.Lock()
	procs := r.procs
	r.procs = nil
	r.mu.Unlock()
	var ph demoPhase
	for _, p := range procs {
		p.stop()
	}
	for _, p := range procs {
		<-p.done
		st := p.cons.Stats()
		ph.replays += st.Duplicates
		ph.naks += st.Naked
		ph.lostAcks += p.lostAcks.Load()
	}
	return ph
}

// handle is the effect: one bbolt transaction in the application's file
// appends a ledger row, unless the fence row says a holder with this
// token or a later one already applied it. The ledger has no uniqueness
// of its own; the guard keeps it exact. The fence covers the one window
// the guard cannot (a process dying between its effect and recording the
// completion in another file): the next holder finds the effect applied
// and does not apply it again.
func (p *demoProc) handle(ctx context.Context, m *broker.Message) ([]byte, error) {
	r := p.r
	tok, ok := consumer.MessageToken(ctx, m)
	if !ok {
		return nil, idem.Permanent(errors.New("demo: no fencing token"))
	}
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	const (
		applied = iota + 1
		stale
		rerun
	)
	var outcome int
	var prev uint32
	err := r.app.Batch(func(tx *bbolt.Tx) error {
		if p.dead.Load() {
			return errCrashed
		}
		outcome = applied
		fence, ledger := tx.Bucket(bFence), tx.Bucket(bLedger)
		if f := fence.Get([]byte(m.ID)); len(f) == 12 {
			ftok := binary.BigEndian.Uint64(f)
			prev = binary.BigEndian.Uint32(f[8:])
			switch {
			case tok < ftok:
				outcome = stale
				return nil
			case tok > ftok:
				outcome = rerun
			}
		}
		var f [12]byte
		binary.BigEndian.PutUint64(f[:], tok)
		binary.BigEndian.PutUint32(f[8:], uint32(p.id))
		if err := fence.Put([]byte(m.ID), f[:]); err != nil {
			return err
		}
		if outcome == rerun {
			return nil
		}
		rows := 1
		switch demoTestFault {
		case "duplicate-effect":
			r.faultOnce.Do(func() { rows = 2 })
		case "lost":
			r.faultOnce.Do(func() { rows = 0 })
		}
		for range rows {
			seq, err := ledger.NextSequence()
			if err != nil {
				return err
			}
			if err := ledger.Put(binary.BigEndian.AppendUint64(nil, seq), []byte(m.ID)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch outcome {
	case stale:
		r.fenced.Add(1)
		return nil, fmt.Errorf("demo: token %d of %s is stale", tok, m.ID)
	case rerun:
		if r.procDead(int(prev)) {
			r.reruns.Add(1)
		} else {
			// The previous holder lost its claim while alive: two live
			// holders ran the handler, which is the guard's failure.
			r.unexplained.Add(1)
		}
	}
	if outcome == applied {
		r.handled.Add(1)
		if ns, err := strconv.ParseInt(m.Headers[demoEnqueuedHdr], 10, 64); err == nil {
			d := time.Since(time.Unix(0, ns))
			r.mu.Lock()
			r.e2e = append(r.e2e, d)
			r.mu.Unlock()
		}
	}
	return []byte("charged"), nil
}

func (r *demoRun) procDead(id int) bool {
	r.mu.Lock()
	p := r.byID[id]
	r.mu.Unlock()
	return p != nil && p.dead.Load()
}

// demoSubscriber counts deliveries and wraps each Acker (lost acks, the
// crash wall, latency).
type demoSubscriber struct {
	*natsbroker.Subscriber
	p *demoProc
}

func (s *demoSubscriber) Fetch(ctx context.Context, max int) ([]*broker.Message, error) {
	if s.p.dead.Load() {
		return nil, errCrashed
	}
	msgs, err := s.Subscriber.Fetch(ctx, max)
	now := time.Now()
	r := s.p.r
	r.deliveries.Add(int64(len(msgs)))
	r.mu.Lock()
	for _, m := range msgs {
		r.delivered[m.ID]++
		lose := r.chance("lost-ack", m.ID, int(r.delivered[m.ID])) < r.c.lostAcks
		m.Acker = &demoAcker{inner: m.Acker, p: s.p, fetched: now, lose: lose}
	}
	r.mu.Unlock()
	return msgs, err
}

type demoAcker struct {
	inner   broker.Acker
	p       *demoProc
	fetched time.Time
	lose    bool
}

func (a *demoAcker) Ack(ctx context.Context) error {
	if a.p.dead.Load() {
		return errCrashed
	}
	d := time.Since(a.fetched)
	a.p.r.mu.Lock()
	a.p.r.latency = append(a.p.r.latency, d)
	a.p.r.mu.Unlock()
	if a.lose {
		// The ack never reaches the broker, which redelivers after its
		// ack wait; the consumer believes it acked.
		a.p.lostAcks.Add(1)
		a.p.r.lostAcks.Add(1)
		return nil
	}
	return a.inner.Ack(ctx)
}

func (a *demoAcker) Nak(ctx context.Context, d time.Duration) error {
	if a.p.dead.Load() {
		return errCrashed
	}
	return a.inner.Nak(ctx, d)
}

func (a *demoAcker) Term(ctx context.Context, reason string) error {
	if a.p.dead.Load() {
		return errCrashed
	}
	return a.inner.Term(ctx, reason)
}

func (a *demoAcker) InProgress(ctx context.Context) error {
	if a.p.dead.Load() {
		return errCrashed
	}
	return a.inner.InProgress(ctx)
}

// crashableStore is a process's view of the shared store: nothing passes
// once the process has crashed (its heartbeat stops extending, its
// completions never arrive).
type crashableStore struct {
	idem.Store
	p *demoProc
}

func (s *crashableStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if s.p.dead.Load() {
		return idem.Claim{}, errCrashed
	}
	return s.Store.Claim(ctx, req)
}

func (s *crashableStore) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	if s.p.dead.Load() {
		return errCrashed
	}
	return s.Store.Complete(ctx, key, token, result)
}

func (s *crashableStore) Release(ctx context.Context, key []byte, token uint64, cause string) error {
	if s.p.dead.Load() {
		return errCrashed
	}
	return s.Store.Release(ctx, key, token, cause)
}

func (s *crashableStore) Fail(ctx context.Context, key []byte, token uint64, cause string) error {
	if s.p.dead.Load() {
		return errCrashed
	}
	return s.Store.Fail(ctx, key, token, cause)
}

func (s *crashableStore) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	if s.p.dead.Load() {
		return errCrashed
	}
	return s.Store.Extend(ctx, key, token, lease)
}

func (s *crashableStore) Get(ctx context.Context, key []byte) (idem.Record, error) {
	if s.p.dead.Load() {
		return idem.Record{}, errCrashed
	}
	return s.Store.Get(ctx, key)
}

// Close leaves the shared store open: the run closes it.
func (s *crashableStore) Close() error { return nil }

// demoBar is a progress bar on a terminal, nothing elsewhere.
type demoBar struct{ b *progressbar.ProgressBar }

func newDemoBar(w io.Writer, total int64, what string) demoBar {
	if w == nil {
		return demoBar{}
	}
	return demoBar{progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(fmt.Sprintf("%-32s", what)),
		progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(), progressbar.OptionSetPredictTime(false),
	)}
}

func (b demoBar) set(n int64) {
	if b.b != nil {
		b.b.Set64(n)
	}
}

func (b demoBar) finish() {
	if b.b != nil {
		b.b.Finish()
	}
}

// pctMs is the q-quantile of ds in milliseconds (0 when empty).
func pctMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q * float64(len(ds)-1))
	return float64(ds[i].Microseconds()) / 1000
}
