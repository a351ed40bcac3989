package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/chaos/internal/shm"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/idem-dev/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

// The batch modes (Spec.Batch > 0). The crash points fire as in the
// single-message handler, once per message: AfterClaim for each message
// the handler got (its claim held, no effect started), AfterEffect for
// each message whose effect the batch's transaction applied (fenced: after
// its COMMIT, no claim completed; tx: inside it, before CompleteBatchTx
// and COMMIT), AfterComplete before each ack of a message this process
// applied. A crash at the n-th message of a batch kills the process with
// the whole batch in hand.

// batchStart counts msgs in handlers, reaches AfterClaim once per
// message, and sorts out the messages that fail: it returns the poison
// messages' errors by index and the indexes of the others; flaky is set
// when a message fails for the first time in this process. done ends the
// batch's holding.
//
// A flaky message fails its whole batch (a transaction that rolled back:
// the runtime retries the batch in process, and it passes), where a
// single-message handler fails alone and is retried in process. Failing
// it alone (a *consumer.PartialError) costs the message an attempt
// instead (a release and a nak): it fails once in every process that
// gets it, and with the deliveries a crash spends, the transactional
// batch mode dead-lettered 9 of 30 flaky messages in a
// crash-after-effect/pg/nats/batch50 cell (MaxAttempts 5 counts broker
// deliveries there).
func (e *effect) batchStart(msgs []*broker.Message) (failed map[int]error, todo []int, flaky bool, done func()) {
	n := int64(len(msgs))
	e.ctr.Add(shm.InHandler, n)
	forget := func() {}
	failed = map[int]error{}
	for i, m := range msgs {
		e.crash.at(AfterClaim)
		if idx, ok := e2etest.Index(m.ID); ok {
			if i == 0 {
				forget = e.holding(idx)
			}
			switch err := e.fails(idx, m); {
			case errors.Is(err, errFlaky):
				flaky = true
			case err != nil:
				failed[i] = err
				continue
			}
		}
		todo = append(todo, i)
	}
	return failed, todo, flaky, func() {
		forget()
		e.ctr.Add(shm.InHandler, -n)
	}
}

// partial is the batch handler's answer once the effects of the messages
// not in failed are durable.
func partial(failed map[int]error) error {
	if len(failed) == 0 {
		return nil
	}
	return &consumer.PartialError{Failed: failed}
}

// handleBatch is the BatchHandler of the fenced mode: the batch's effects
// in ONE ledger transaction, each message's under its own claim's token
// (consumer.MessageToken) and fence row, as fenced applies one. A message
// a newer holder has fenced writes nothing and fails alone (its claim was
// lost: the runtime's claim-lost path); any other error rolls the whole
// transaction back and fails the batch (nothing applied).
func (e *effect) handleBatch(ctx context.Context, msgs []*broker.Message) error {
	failed, todo, flaky, done := e.batchStart(msgs)
	defer done()
	if flaky {
		return errFlaky
	}
	if err := e.delay(ctx); err != nil {
		return err
	}
	tokens := make([]uint64, len(msgs))
	live := todo[:0:0]
	for _, i := range todo {
		t, ok := consumer.MessageToken(ctx, msgs[i])
		if !ok {
			failed[i] = idem.Permanent(fmt.Errorf("chaos: no fencing token for message %s in the batch handler's context", msgs[i].ID))
			continue
		}
		tokens[i] = t
		live = append(live, i)
	}
	// Fence rows are locked in one order by every process: two batches
	// sharing keys (a stale holder's and its successor's) wait for each
	// other instead of deadlocking.
	slices.SortFunc(live, func(a, b int) int { return strings.Compare(msgs[a].ID, msgs[b].ID) })
	outcomes := make([]string, len(msgs))
	errs := make([]error, len(msgs))
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		for _, i := range live {
			outcomes[i], errs[i] = e.fence(ctx, tx, msgs[i], tokens[i])
			if errs[i] != nil && outcomes[i] != "fenced" {
				return errs[i]
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, i := range live {
		e.count(outcomes[i], errs[i])
		if outcomes[i] == "fenced" {
			failed[i] = errs[i]
			continue
		}
		e.ran.Store(msgs[i], true)
	}
	for _, i := range live {
		if outcomes[i] != "fenced" {
			e.crash.at(AfterEffect)
		}
	}
	return partial(failed)
}

// txBatch is the effect of the tx batch mode (pgstore.TxBatchHandler):
// run inside the transaction that claimed msgs' keys (ClaimBatchTx) and
// completes them with it (CompleteBatchTx), it writes their ledger rows.
// The claims are the transaction's own, so no token reaches the effect:
// the rows carry token 0. A COMMIT whose answer was lost is run again by
// the runtime and finds the keys completed: the rows are not written
// twice.
func (e *effect) txBatch(ctx context.Context, tx pgx.Tx, msgs []*broker.Message) ([][]byte, error) {
	failed, todo, flaky, done := e.batchStart(msgs)
	defer done()
	if flaky {
		return nil, errFlaky
	}
	if err := e.delay(ctx); err != nil {
		return nil, err
	}
	for _, i := range todo {
		if err := e.insert(ctx, tx, msgs[i], 0); err != nil {
			return nil, err
		}
	}
	for _, i := range todo {
		e.crash.at(AfterEffect)
		e.ran.Store(msgs[i], true)
	}
	return nil, partial(failed)
}

// batchHandlers sets cfg's handler for the batch mode of spec.
func (e *effect) batchHandlers(cfg *consumer.Config, spec Spec) error {
	cfg.Handler = nil
	// Fewer workers than the runtime's 16, and a longer wait, so that
	// batches fill: messages are spread over the workers by key.
	cfg.Batch = consumer.BatchConfig{Size: spec.Batch, Wait: 50 * time.Millisecond}
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
	if spec.Effect != EffectTx {
		cfg.BatchHandler = e.handleBatch
		return nil
	}
	if e.st.pgs == nil {
		return errors.New("chaos: the tx effect needs the pg store")
	}
	h, err := pgstore.TxBatchHandler(e.st.pgs, pgstore.TxHandlerConfig{}, e.txBatch)
	if err != nil {
		return err
	}
	cfg.TxBatchHandler = func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		outs, err := h(ctx, items)
		for _, o := range outs {
			if o.Status == consumer.TxDone {
				e.ctr.Add(shm.Effects, 1)
			}
		}
		return outs, err
	}
	return nil
}
