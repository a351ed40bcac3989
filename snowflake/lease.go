package snowflake

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// A worker id is leased as one idem record per worker id, key
// "idem-snowflake/<LeaseName>/worker/<n>": a claim that acquires it is the
// lease, Extend is the heartbeat, Release hands it back with the last
// millisecond used as its cause. The store's fencing does the rest: a
// generator whose lease lapsed and was taken over gets ErrFenced on its
// next Extend and stops for good.
const floorPrefix = "snowflake last_unix_ms="

func leaseKey(name string, w int64) []byte {
	return []byte("idem-snowflake/" + name + "/worker/" + strconv.FormatInt(w, 10))
}

type lease struct {
	g      *Generator
	store  idem.Store
	key    []byte
	token  uint64
	worker int64
	stop   chan struct{}
	done   chan struct{}
}

// acquire claims the first free worker id, starting at a random one so
// that generators starting together rarely race for the same record. It
// returns the previous holder's last millisecond (relative to the epoch),
// or -1.
func acquire(ctx context.Context, g *Generator, c Config) (*lease, int64, error) {
	n := c.Layout.MaxWorker() + 1
	start := rand.Int64N(n)
	for i := int64(0); i < n; i++ {
		w := (start + i) % n
		sent := c.Clock.Now()
		cl, err := c.Store.Claim(ctx, idem.ClaimRequest{Key: leaseKey(c.LeaseName, w), Lease: c.Lease, TTL: c.LeaseRetention})
		if err != nil {
			return nil, -1, fmt.Errorf("snowflake: lease a worker id: %w", err)
		}
		if cl.Outcome != idem.OutcomeAcquired {
			continue // held by a live generator (or not ours to take)
		}
		g.validUntil = validUntil(sent, c.Lease)
		floor := int64(-1)
		if v, ok := strings.CutPrefix(cl.Record.LastError, floorPrefix); ok {
			if abs, err := strconv.ParseInt(v, 10, 64); err == nil {
				floor = abs - g.epochMs
			}
		}
		c.Logger.Debug("snowflake: leased worker id", "worker", w, "token", cl.Record.Token, "floor_ms", floor)
		return &lease{g: g, store: c.Store, key: leaseKey(c.LeaseName, w), token: cl.Record.Token, worker: w,
			stop: make(chan struct{}), done: make(chan struct{})}, floor, nil
	}
	return nil, -1, fmt.Errorf("%w: all %d worker ids of %q are leased", ErrNoWorker, n, c.LeaseName)
}

// validUntil is when a lease renewed by a request sent at sent stops
// covering new ids. The store started the lease no earlier than sent; the
// tenth kept back covers clock rate differences between here and the store.
func validUntil(sent time.Time, lease time.Duration) time.Time { return sent.Add(lease - lease/10) }

func (l *lease) start() {
	if l.g.cfg.manualBeat {
		close(l.done) // the test renews with beat
		return
	}
	go l.run()
}

func (l *lease) run() {
	defer close(l.done)
	t := time.NewTicker(l.g.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		if !l.beat() {
			return
		}
	}
}

// beat renews the lease once. It returns false when the lease is lost for
// good (taken over or removed): no renewal can bring it back.
func (l *lease) beat() bool {
	c := &l.g.cfg
	sent := c.Clock.Now()
	ctx, cancel := context.WithTimeout(context.Background(), c.Heartbeat)
	err := l.store.Extend(ctx, l.key, l.token, c.Lease)
	cancel()
	g := l.g
	g.mu.Lock()
	switch {
	case err == nil:
		g.validUntil = validUntil(sent, c.Lease)
		g.lapsed = false
		g.mu.Unlock()
	case errors.Is(err, idem.ErrFenced), errors.Is(err, idem.ErrNotFound):
		g.lost = fmt.Errorf("%w: snowflake: worker %d taken over or removed: %w", idem.ErrLeaseLost, l.worker, err)
		g.mu.Unlock()
		c.Logger.Error("snowflake: worker lease lost; generator stopped", "worker", l.worker, "err", err)
		if f := c.Hooks.OnLeaseLost; f != nil {
			f(l.worker, true, err)
		}
		return false
	default:
		report := !sent.Before(g.validUntil) && !g.lapsed
		if report {
			g.lapsed = true
			if f := c.Hooks.OnLeaseLost; f != nil {
				f(l.worker, false, err)
			}
		}
		g.mu.Unlock()
		c.Logger.Warn("snowflake: worker lease renewal failed", "worker", l.worker, "err", err, "expired", report)
	}
	return true
}

// close stops the heartbeat and releases the worker id with the last
// millisecond used (absolute Unix milliseconds).
func (l *lease) close(lastUnixMs int64) error {
	close(l.stop)
	<-l.done
	l.g.mu.Lock()
	lost := l.g.lost
	l.g.mu.Unlock()
	if lost != nil {
		return nil // nothing of ours left to release
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	floor := floorPrefix + strconv.FormatInt(lastUnixMs, 10)
	err := l.store.Release(ctx, l.key, l.token, floor)
	if errors.Is(err, idem.ErrFenced) || errors.Is(err, idem.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("snowflake: release worker %d: %w", l.worker, err)
	}
	// The record keeps the floor only until its ExpiresAt, which the claim
	// set LeaseRetention after it was made and the heartbeats only raised
	// to the lease's end: a generator older than LeaseRetention would
	// leave its floor for less than a lease. Claim the released record
	// again, which sets ExpiresAt LeaseRetention from now, and release it
	// with the floor. Whoever took it meanwhile has read the floor.
	cl, err := l.store.Claim(ctx, idem.ClaimRequest{Key: l.key, Lease: l.g.cfg.Lease, TTL: l.g.cfg.LeaseRetention})
	if err != nil || cl.Outcome != idem.OutcomeAcquired {
		if err != nil {
			l.g.cfg.Logger.Warn("snowflake: could not renew the released worker record's retention", "worker", l.worker, "err", err)
		}
		return nil
	}
	err = l.store.Release(ctx, l.key, cl.Record.Token, floor)
	if err != nil && !errors.Is(err, idem.ErrFenced) && !errors.Is(err, idem.ErrNotFound) {
		return fmt.Errorf("snowflake: release worker %d: %w", l.worker, err)
	}
	return nil
}
