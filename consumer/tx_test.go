package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

// storeTx is a TxBatchHandler over a store and a ledger, the shape a
// pgstore one has (ClaimBatchTx, effect, CompleteTx in one transaction);
// memstore has no transactions, which these runtime tests do not need:
// its calls are separate, so a test whose store fails between them makes
// each call one transaction (outageEnv.storeTx).
func storeTx(st idem.Store, led *ledger) consumer.TxBatchHandler {
	return func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		reqs := make([]idem.ClaimRequest, len(items))
		for i, it := range items {
			reqs[i] = idem.ClaimRequest{Key: it.Key, Fingerprint: it.Fingerprint, Lease: time.Minute, TTL: time.Hour}
		}
		res, err := st.(idem.BatchClaimer).ClaimBatch(ctx, reqs)
		if err != nil {
			return nil, err
		}
		out := make([]consumer.TxOutcome, len(items))
		for i, r := range res {
			o, acquired := consumer.ClaimOutcome(r.Claim, r.Err)
			if acquired {
				led.add(string(items[i].Key), "")
				if err := st.Complete(ctx, items[i].Key, r.Claim.Record.Token, nil); err != nil {
					return nil, err
				}
			}
			out[i] = o
		}
		return out, nil
	}
}

func TestTxBatchExactlyOnce(t *testing.T) {
	e := newEnv(t)
	led := newLedger()
	cfg := e.config(e.sub("g"))
	cfg.TxBatchHandler = storeTx(e.store, led)
	var msgs []*broker.Message
	for i := range 500 {
		msgs = append(msgs, msg(fmt.Sprint(i), "x"))
	}
	msgs = append(msgs, msgs[:100]...) // duplicate publishes
	e.publish(msgs...)
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "all settled", func() bool { s := c.Stats(); return s.Handled+s.Duplicates == 600 })
	stop()
	for i := range 500 {
		if n := led.count(fmt.Sprint(i)); n != 1 {
			t.Fatalf("message %d took effect %d times", i, n)
		}
	}
}

// TestTxHandlerExactlyOnce: the single-message transactional mode, with
// duplicate publishes.
func TestTxHandlerExactlyOnce(t *testing.T) {
	e := newEnv(t)
	led := newLedger()
	cfg := e.config(e.sub("g"))
	tx := storeTx(e.store, led)
	var calls atomic.Int64
	cfg.TxHandler = func(ctx context.Context, it consumer.TxItem) (consumer.TxOutcome, error) {
		calls.Add(1)
		outs, err := tx(ctx, []consumer.TxItem{it})
		if err != nil {
			return consumer.TxOutcome{}, err
		}
		return outs[0], nil
	}
	var msgs []*broker.Message
	for i := range 200 {
		msgs = append(msgs, msg(fmt.Sprint(i), "x"))
	}
	msgs = append(msgs, msgs[:50]...) // duplicate publishes
	e.publish(msgs...)
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "all settled", func() bool { s := c.Stats(); return s.Handled+s.Duplicates == 250 })
	stop()
	for i := range 200 {
		if n := led.count(fmt.Sprint(i)); n != 1 {
			t.Fatalf("message %d took effect %d times", i, n)
		}
	}
	if calls.Load() != 250 {
		t.Fatalf("handler called %d times for 250 deliveries", calls.Load())
	}
}

func TestTxBatchOutcomes(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(e.sub("g"))
	cfg.Workers = 1
	cfg.Batch.Wait = 20 * time.Millisecond
	cfg.MaxAttempts = 2
	cfg.DeadLetter = e.b.NewPublisher()
	cfg.TxBatchHandler = func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
		out := make([]consumer.TxOutcome, len(items))
		for i, it := range items {
			switch {
			case strings.HasPrefix(it.Msg.ID, "busy") && it.Msg.Delivery == 1:
				out[i] = consumer.TxOutcome{Status: consumer.TxInProgress, RetryAfter: 7 * time.Millisecond}
			case strings.HasPrefix(it.Msg.ID, "bad"):
				out[i] = consumer.TxOutcome{Status: consumer.TxRejected, Err: errBoom}
			case strings.HasPrefix(it.Msg.ID, "flaky"):
				out[i] = consumer.TxOutcome{Status: consumer.TxRetry, Err: errBoom}
			default:
				out[i] = consumer.TxOutcome{Status: consumer.TxDone}
			}
		}
		return out, nil
	}
	e.publish(msg("ok", "x"), msg("busy", "x"), msg("bad", "x"), msg("flaky", "x"))
	c, _ := consumer.New(cfg)
	stop := run(t, c)
	waitFor(t, "settled", func() bool {
		return e.log.Acks("ok") == 1 && e.log.Acks("busy") == 1 && e.log.Terms("bad") == 1 && e.log.Terms("flaky") == 1
	})
	stop()
	if naks := e.log.Naks("busy"); len(naks) != 1 || naks[0] != 7*time.Millisecond {
		t.Fatalf("busy naks %v", naks)
	}
	// flaky: nak'ed once (delivery 1), dead-lettered at delivery 2.
	if naks := e.log.Naks("flaky"); len(naks) != 1 {
		t.Fatalf("flaky naks %v", naks)
	}
	if got := len(e.b.Published("orders.dead-letter")); got != 2 {
		t.Fatalf("%d dead letters, want 2 (bad, flaky)", got)
	}
}

func TestTxBatchWholeFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   consumer.TxBatchHandler
	}{
		{"error", func(context.Context, []consumer.TxItem) ([]consumer.TxOutcome, error) { return nil, errBoom }},
		{"wrong outcome count", func(context.Context, []consumer.TxItem) ([]consumer.TxOutcome, error) { return nil, nil }},
		{"panic", func(context.Context, []consumer.TxItem) ([]consumer.TxOutcome, error) { panic("tx") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config(e.sub("g"))
			cfg.MaxAttempts = 3
			cfg.InProcessRetries = 1
			cfg.DeadLetter = e.b.NewPublisher()
			var runs atomic.Int64
			cfg.TxBatchHandler = func(ctx context.Context, items []consumer.TxItem) ([]consumer.TxOutcome, error) {
				runs.Add(1)
				return tc.fn(ctx, items)
			}
			e.publish(msg("a", "x"))
			c, _ := consumer.New(cfg)
			stop := run(t, c)
			waitFor(t, "dead-lettered", func() bool { return e.log.Terms("a") == 1 })
			stop()
			// 3 deliveries x (1 + 1 in-process retry).
			if runs.Load() != 6 || len(e.log.Naks("a")) != 2 || e.log.Acks("a") != 0 {
				t.Fatalf("runs %d, naks %v, acks %d", runs.Load(), e.log.Naks("a"), e.log.Acks("a"))
			}
		})
	}
}

func TestClaimOutcome(t *testing.T) {
	lease := time.Now().Add(time.Minute)
	mismatch := fmt.Errorf("%w: other payload", idem.ErrFingerprintMismatch)
	down := fmt.Errorf("%w: refused", idem.ErrUnavailable)
	for _, tc := range []struct {
		name     string
		c        idem.Claim
		err      error
		status   consumer.TxStatus
		acquired bool
		wantErr  error
	}{
		{"acquired", idem.Claim{Outcome: idem.OutcomeAcquired}, nil, consumer.TxDone, true, nil},
		{"completed", idem.Claim{Outcome: idem.OutcomeCompleted}, nil, consumer.TxDuplicate, false, nil},
		{"in progress", idem.Claim{Outcome: idem.OutcomeInProgress, Record: idem.Record{LeaseUntil: lease}}, nil, consumer.TxInProgress, false, nil},
		{"in progress error", idem.Claim{}, &idem.InProgressError{Key: []byte("k"), LeaseUntil: lease}, consumer.TxInProgress, false, nil},
		{"lock wait", idem.Claim{}, idem.ErrInProgress, consumer.TxInProgress, false, nil},
		// The store's clock 10 h ahead of ours: the wait is bounded by the
		// holder's lease, not the skew.
		{"in progress, store clock ahead", idem.Claim{Outcome: idem.OutcomeInProgress, Record: idem.Record{
			LeaseUntil: time.Now().Add(10*time.Hour + time.Minute), UpdatedAt: time.Now().Add(10 * time.Hour)}}, nil, consumer.TxInProgress, false, nil},
		{"in progress error, store clock ahead", idem.Claim{}, &idem.InProgressError{Key: []byte("k"), LeaseUntil: time.Now().Add(10 * time.Hour), Lease: time.Minute},
			consumer.TxInProgress, false, nil},
		{"failed", idem.Claim{Outcome: idem.OutcomeFailed, Record: idem.Record{LastError: "bad"}}, nil, consumer.TxRejected, false, idem.ErrFailed},
		{"failed error", idem.Claim{}, &idem.FailedError{Key: []byte("k")}, consumer.TxRejected, false, idem.ErrFailed},
		{"fingerprint", idem.Claim{}, mismatch, consumer.TxRejected, false, idem.ErrFingerprintMismatch},
		{"store down", idem.Claim{}, down, consumer.TxRetry, false, idem.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, acq := consumer.ClaimOutcome(tc.c, tc.err)
			if o.Status != tc.status || acq != tc.acquired || (tc.wantErr != nil && !errors.Is(o.Err, tc.wantErr)) {
				t.Fatalf("ClaimOutcome = %+v, %v; want status %d, acquired %v, error %v", o, acq, tc.status, tc.acquired, tc.wantErr)
			}
			if o.Status == consumer.TxInProgress && (o.RetryAfter <= 0 || o.RetryAfter > time.Minute) {
				t.Fatalf("RetryAfter %s", o.RetryAfter)
			}
		})
	}
}
