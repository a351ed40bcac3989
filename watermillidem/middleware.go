package watermillidem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/idem-dev/idem"
)

// Deduplicator is a Watermill handler middleware backed by an idem guard:
// a drop-in replacement for middleware.Deduplicator
// (router.AddMiddleware(d.Middleware)). For each message it claims the
// message's key in the guard's store, runs the handler only when the claim
// is acquired, and settles the claim by the handler's outcome:
//
//   - handler succeeded: the claim is completed with the messages it
//     produced (replayed to duplicates) and the message is acked;
//   - handler failed: the claim is released (the message is nacked and runs
//     again on redelivery), or, attempts used up or idem.Permanent, marked
//     failed and the message dead-lettered;
//   - handler's system unreachable (after classification): the claim is
//     kept and the handler runs again after a wait, spending no attempt;
//   - completed before (a duplicate): acked, handler not run, the first
//     run's messages returned again (unless NoReplay);
//   - in progress elsewhere: nacked after waiting for the holder's lease
//     (at most RetryWait), never acked: the first run may still fail;
//   - store unreachable: nacked after RetryWait, handler not run (fail
//     closed);
//   - failed for good, another payload under the key, no key: dead-lettered
//     once and acked, or (no DeadLetter) nacked with an error IsPoison
//     recognises.
//
// The handler's message context carries the claim's fencing token
// (TokenFromContext) and is cancelled with idem.ErrLeaseLost if the claim
// is taken over while it runs.
type Deduplicator struct {
	cfg      Config
	classify func(error) error

	handled, duplicates, inProgress, storeErrors, deadLettered, holds, unrecorded, lost atomic.Int64
}

// New returns a Deduplicator.
func New(cfg Config) (*Deduplicator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	fs := []func(error) error{idem.ClassifyError}
	if ec, ok := cfg.Guard.Store().(idem.ErrorClassifier); ok {
		fs = append(fs, ec.ClassifyError)
	}
	if cfg.ClassifyError != nil {
		fs = append(fs, cfg.ClassifyError)
	}
	return &Deduplicator{cfg: cfg, classify: func(err error) error {
		for _, f := range fs {
			if e := f(err); e != nil {
				err = e
			}
		}
		return err
	}}, nil
}

// Stats are a Deduplicator's counters.
type Stats struct {
	Handled      int64 // handler runs that succeeded and were acked
	Duplicates   int64 // messages completed before: acked without running
	InProgress   int64 // nacked because another worker held the key
	StoreErrors  int64 // nacked because the store could not be reached
	DeadLettered int64 // messages published to DeadLetterTopic
	Holds        int64 // handler runs repeated under the same claim after an unreachable system
	Unrecorded   int64 // effects done whose record the store did not take in time (acked; the guard keeps trying)
	LeaseLost    int64 // effects done after their claim was taken over (nacked)
}

// Stats returns the counters.
func (d *Deduplicator) Stats() Stats {
	return Stats{Handled: d.handled.Load(), Duplicates: d.duplicates.Load(), InProgress: d.inProgress.Load(),
		StoreErrors: d.storeErrors.Load(), DeadLettered: d.deadLettered.Load(), Holds: d.holds.Load(),
		Unrecorded: d.unrecorded.Load(), LeaseLost: d.lost.Load()}
}

// Middleware is the message.HandlerMiddleware.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return d.handle(h, msg) }
}

func (d *Deduplicator) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	key, err := d.cfg.Key(msg)
	if err == nil {
		err = idem.ValidateKey(key)
	}
	if err != nil {
		if !errors.Is(err, ErrNoKey) {
			err = fmt.Errorf("%w: %w", ErrNoKey, err)
		}
		return d.poison(msg, err)
	}
	held, res, err := d.cfg.Guard.Acquire(ctx, key, idem.WithFingerprint(d.cfg.Fingerprint(msg)))
	switch {
	case err == nil && held == nil: // completed before (or a fail-open pass)
		d.duplicates.Add(1)
		if d.cfg.NoReplay || !res.Replayed {
			return nil, nil
		}
		out, derr := decodeResult(res.Value)
		if derr != nil {
			d.cfg.Logger.Warn("watermillidem: the record's result is not a list of messages; duplicate acked without replay", "uuid", msg.UUID, "key", string(key), "err", derr)
			return nil, nil
		}
		return out, nil
	case errors.Is(err, idem.ErrFailed), errors.Is(err, idem.ErrFingerprintMismatch):
		return d.poison(msg, err)
	case errors.Is(err, idem.ErrInProgress):
		d.inProgress.Add(1)
		wait := d.cfg.RetryWait
		var ip *idem.InProgressError
		if errors.As(err, &ip) {
			wait = min(wait, ip.RetryAfter(time.Now()))
		}
		sleep(ctx, wait)
		return nil, err
	case err != nil:
		d.storeErrors.Add(1)
		sleep(ctx, d.cfg.RetryWait)
		return nil, err
	}
	return d.run(h, msg, held)
}

// run runs the handler under held and settles it.
func (d *Deduplicator) run(h message.HandlerFunc, msg *message.Message, held *idem.Held) ([]*message.Message, error) {
	ctx := msg.Context()
	wait := 100 * time.Millisecond
	for {
		out, herr := d.call(h, msg, held)
		if herr == nil {
			return d.complete(msg, held, out)
		}
		if cerr := d.classify(herr); !idem.IsPermanent(cerr) &&
			(errors.Is(cerr, idem.ErrUnavailable) || errors.Is(cerr, idem.ErrUnknownOutcome) || errors.Is(cerr, idem.ErrInProgress)) &&
			ctx.Err() == nil && !lost(held) {
			// The handler's system is unreachable: keep the claim (the
			// heartbeat keeps its lease) and run it again; no attempt spent.
			d.holds.Add(1)
			sleep(ctx, wait)
			wait = min(2*wait, d.cfg.HoldWait)
			if ctx.Err() == nil && !lost(held) {
				continue
			}
		}
		rerr := held.Release(context.WithoutCancel(ctx), herr)
		if errors.Is(rerr, idem.ErrFailed) {
			return d.poison(msg, rerr)
		}
		if rerr != nil {
			d.cfg.Logger.Warn("watermillidem: release after a handler failure not recorded; the key frees when its lease lapses", "uuid", msg.UUID, "err", rerr)
		}
		return nil, herr
	}
}

func lost(h *idem.Held) bool {
	select {
	case <-h.Done():
		return true
	default:
		return false
	}
}

type tokenKey struct{}

// TokenFromContext returns the fencing token of the claim the handler runs
// under (the message's context inside the handler). Write the effect
// conditionally on it where its store allows, so a worker whose claim was
// taken over cannot apply a stale effect.
func TokenFromContext(ctx context.Context) (uint64, bool) {
	t, ok := ctx.Value(tokenKey{}).(uint64)
	return t, ok
}

// call runs h with msg's context replaced by one that carries the token and
// is cancelled with idem.ErrLeaseLost if the claim is lost. A panic
// releases the claim and goes on up (to Watermill's Recoverer).
func (d *Deduplicator) call(h message.HandlerFunc, msg *message.Message, held *idem.Held) (out []*message.Message, err error) {
	orig := msg.Context()
	hctx, cancel := context.WithCancelCause(context.WithValue(orig, tokenKey{}, held.Token()))
	stop := make(chan struct{})
	go func() {
		select {
		case <-held.Done():
			cancel(fmt.Errorf("%w: key %q", idem.ErrLeaseLost, held.Key()))
		case <-stop:
		}
	}()
	msg.SetContext(hctx)
	defer func() {
		close(stop)
		cancel(nil)
		msg.SetContext(orig)
		if r := recover(); r != nil {
			_ = held.Release(context.WithoutCancel(orig), fmt.Errorf("panic: %v", r))
			panic(r)
		}
	}()
	return h(msg)
}

// complete records the effect with the produced messages as its result.
func (d *Deduplicator) complete(msg *message.Message, held *idem.Held, out []*message.Message) ([]*message.Message, error) {
	var result []byte
	if !d.cfg.NoReplay {
		result = encodeResult(out)
	}
	err := held.Complete(context.WithoutCancel(msg.Context()), result)
	switch {
	case err == nil:
		d.handled.Add(1)
		return out, nil
	case errors.Is(err, idem.ErrUnrecorded), errors.Is(err, idem.ErrResultTooLarge):
		// The effect is done: acking is right; the guard keeps recording it
		// (unrecorded) or has marked the key failed (result too large).
		d.handled.Add(1)
		d.unrecorded.Add(1)
		d.cfg.Logger.Error("watermillidem: effect done but not recorded as is; acked", "uuid", msg.UUID, "key", string(held.Key()), "err", err)
		return out, nil
	default:
		// Taken over (fenced, gone) or the guard closed: never ack; the
		// claim's new holder decides.
		d.lost.Add(1)
		d.cfg.Logger.Error("watermillidem: completion refused: the claim was lost while the handler ran; nacked", "uuid", msg.UUID, "key", string(held.Key()), "err", err)
		return nil, err
	}
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
