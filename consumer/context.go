package consumer

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
)

type heldKey struct{}

// heldInfo is what a single-message handler's context carries.
type heldInfo struct {
	key   []byte
	token uint64
	d     *delivery
}

func withHeld(ctx context.Context, d *delivery, token uint64) context.Context {
	return context.WithValue(ctx, heldKey{}, heldInfo{key: d.key, token: token, d: d})
}

type batchKey struct{}

// batchInfo is what a batch handler's context carries: each message's
// claim, and lookups by message and by key, made on first use.
type batchInfo struct {
	ds    []*delivery  // in the order the handler got them
	helds []*idem.Held // helds[i] is ds[i]'s claim
	// next is where the next MessageToken most likely looks: just after
	// the message found last (handlers mostly go through their messages
	// in order), so that an in-order handler needs no map.
	next    atomic.Int64
	msgOnce sync.Once
	byMsg   map[*broker.Message]int
	keyOnce sync.Once
	byKey   map[string]uint64
}

// token returns the claim token of m, a message of the batch.
func (b *batchInfo) token(m *broker.Message) (uint64, bool) {
	i := int(b.next.Load())
	if i >= len(b.ds) || b.ds[i].m != m {
		b.msgOnce.Do(func() {
			b.byMsg = make(map[*broker.Message]int, len(b.ds))
			for j, d := range b.ds {
				b.byMsg[d.m] = j
			}
		})
		var ok bool
		if i, ok = b.byMsg[m]; !ok {
			return 0, false
		}
	}
	b.next.Store(int64(i + 1))
	return b.helds[i].Token(), true
}

// KeyFromContext returns the idempotency key of the message whose handler
// runs with ctx (single-message mode).
func KeyFromContext(ctx context.Context) ([]byte, bool) {
	h, ok := ctx.Value(heldKey{}).(heldInfo)
	return h.key, ok
}

// TokenFromContext returns the fencing token of the claim under which a
// single-message handler runs. Pass it to the effect's store when it can
// check it (a conditional write), so a worker whose lease was taken over
// cannot apply a stale effect. In batch mode use MessageToken.
func TokenFromContext(ctx context.Context) (uint64, bool) {
	h, ok := ctx.Value(heldKey{}).(heldInfo)
	return h.token, ok && h.token != 0
}

// MessageToken returns the fencing token of m's claim inside a Handler or
// a BatchHandler (m as the handler received it). In batch mode each
// message has its own claim and token; a conditional write of the effect
// that checks it keeps a worker whose lease was taken over from applying a
// stale effect. It reports false outside a handler, for a message the
// handler was not given, under fail-open (no claim), and in the
// transactional modes, where the claim is the handler's own (its
// Claim.Record.Token).
func MessageToken(ctx context.Context, m *broker.Message) (uint64, bool) {
	if h, ok := ctx.Value(heldKey{}).(heldInfo); ok {
		if h.d == nil || h.d.m != m || h.token == 0 {
			return 0, false
		}
		return h.token, true
	}
	if b, ok := ctx.Value(batchKey{}).(*batchInfo); ok {
		t, ok := b.token(m)
		return t, ok && t != 0
	}
	return 0, false
}

// HeldToken returns the fencing token of the claim the consumer runtime
// holds on key while the Handler or BatchHandler that got ctx runs (in batch
// mode, the claim of the batch's message with that idempotency key). It
// reports false for a key the runtime does not hold for this handler,
// outside a handler, under fail-open and in the transactional modes.
//
// A store's transactional call uses it to recognise the runtime's own
// claim: pgstore's and mysqlstore's DoTx, called in a handler for the
// message's own key, run the effect under that claim and complete it in
// the effect's transaction, instead of reporting the key in progress.
func HeldToken(ctx context.Context, key []byte) (uint64, bool) {
	if h, ok := ctx.Value(heldKey{}).(heldInfo); ok {
		if h.token == 0 || !bytes.Equal(h.key, key) {
			return 0, false
		}
		return h.token, true
	}
	if b, ok := ctx.Value(batchKey{}).(*batchInfo); ok {
		b.keyOnce.Do(func() {
			b.byKey = make(map[string]uint64, len(b.ds))
			for i, d := range b.ds {
				if t := b.helds[i].Token(); t != 0 {
					b.byKey[string(d.key)] = t
				}
			}
		})
		t, ok := b.byKey[string(key)]
		return t, ok
	}
	return 0, false
}

// deliveryFrom returns the delivery a single-message handler runs for.
func deliveryFrom(ctx context.Context) *delivery {
	h, _ := ctx.Value(heldKey{}).(heldInfo)
	return h.d
}

// watchLease is watchLeases for one claim.
func watchLease(ctx context.Context, held *idem.Held) (hctx context.Context, stop func()) {
	return watchLeases(ctx, held, nil, nil)
}

// watchLeases returns a context cancelled with idem.ErrLeaseLost (naming
// the key) as soon as any of helds is lost (taken over after a lease
// expiry, or deleted) while the handler runs. stop disarms it and cancels
// the context. (one is the only claim when helds is nil; ds names the keys
// of helds.) idem.AfterLost costs a registration per claim: no goroutine,
// timer or channel (a watcher goroutine in a select over every claim's
// Done channel, started after 50 ms, was 5% of the CPU of a guarded batch
// consume whose transactions took longer than that).
func watchLeases(ctx context.Context, one *idem.Held, helds []*idem.Held, ds []*delivery) (hctx context.Context, stop func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	var disarm func() bool
	switch {
	case one != nil:
		disarm = idem.AfterLost([]*idem.Held{one}, func(int) { cancel(idem.ErrLeaseLost) })
	case len(helds) > 0:
		disarm = idem.AfterLost(helds, func(i int) {
			cancel(fmt.Errorf("%w: key %q (message %s)", idem.ErrLeaseLost, ds[i].key, ds[i].m.ID))
		})
	default:
		return hctx, func() { cancel(nil) }
	}
	return hctx, func() {
		disarm()
		cancel(nil)
	}
}
