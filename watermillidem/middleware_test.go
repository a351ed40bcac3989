package watermillidem_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/watermillidem"
)

// TestInProgressDuplicateIsNacked: a duplicate that arrives while the first
// copy's handler runs is nacked (an error), never acked, and the handler
// does not run for it; once the first copy completed, a redelivery is
// acked as a duplicate.
func TestInProgressDuplicateIsNacked(t *testing.T) {
	d := newDedup(t, watermillidem.Config{Guard: newGuard(t, newStore(t))})
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		close(started)
		<-release
		return nil, nil
	})
	first := make(chan error, 1)
	go func() {
		_, err := h(msg("a", "p"))
		first <- err
	}()
	<-started
	out, err := h(msg("a", "p"))
	if !errors.Is(err, idem.ErrInProgress) || out != nil {
		t.Fatalf("duplicate while in progress: %v, %v; want ErrInProgress (a nack)", out, err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := h(msg("a", "p")); err != nil {
		t.Fatalf("duplicate after completion: %v, want nil (ack)", err)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
	if st := d.Stats(); st.Handled != 1 || st.Duplicates != 1 || st.InProgress != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReplay: a duplicate gets the messages the first run produced (same
// UUIDs, metadata and payloads), so a router whose publish of them failed
// after the record was written publishes them on the redelivery; NoReplay
// returns none.
func TestReplay(t *testing.T) {
	for _, noReplay := range []bool{false, true} {
		t.Run(fmt.Sprint("NoReplay=", noReplay), func(t *testing.T) {
			d := newDedup(t, watermillidem.Config{Guard: newGuard(t, newStore(t)), NoReplay: noReplay})
			h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
				a := message.NewMessage("out-1", []byte("one"))
				a.Metadata.Set("k", "v")
				return []*message.Message{a, message.NewMessage("out-2", nil)}, nil
			})
			first, err := h(msg("a", "p"))
			if err != nil || len(first) != 2 {
				t.Fatalf("first run: %v, %v", first, err)
			}
			again, err := h(msg("a", "p"))
			if err != nil {
				t.Fatal(err)
			}
			if noReplay {
				if len(again) != 0 {
					t.Fatalf("NoReplay returned %d messages", len(again))
				}
				return
			}
			if len(again) != 2 || !again[0].Equals(first[0]) || !again[1].Equals(first[1]) {
				t.Fatalf("replay %v, want %v", again, first)
			}
		})
	}
}

// TestPoisonDeadLetteredOnce: a message whose handler always fails is
// retried until the guard's MaxAttempts, then published once to the
// dead-letter topic with Watermill's poison metadata and acked; a
// redelivery after that is acked without a second dead letter. A
// Permanent error, a UUID reused with another payload and a missing key go
// there at once.
func TestPoisonDeadLetteredOnce(t *testing.T) {
	ps := goChannel(t)
	dead, err := ps.Subscribe(t.Context(), "dlq")
	if err != nil {
		t.Fatal(err)
	}
	d := newDedup(t, watermillidem.Config{Guard: newGuard(t, newStore(t), idem.WithMaxAttempts(3)),
		DeadLetter: ps, DeadLetterTopic: "dlq", Key: watermillidem.KeyFromMetadata("order")})
	var runs atomic.Int64
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		if m.Metadata.Get("permanent") != "" {
			return nil, idem.Permanent(errors.New("bad order"))
		}
		return nil, errors.New("always fails")
	})
	with := func(order, payload string, meta ...string) *message.Message {
		m := msg("uuid-"+order+"-"+payload, payload)
		if order != "" {
			m.Metadata.Set("order", order)
		}
		for i := 0; i+1 < len(meta); i += 2 {
			m.Metadata.Set(meta[i], meta[i+1])
		}
		return m
	}
	nacks := 0
	for {
		_, err := h(with("1", "p"))
		if err == nil {
			break
		}
		nacks++
		if nacks > 10 {
			t.Fatalf("still nacked after %d deliveries: %v", nacks, err)
		}
	}
	if runs.Load() != 3 || nacks != 2 {
		t.Fatalf("handler ran %d times, %d nacks; want 3 and 2", runs.Load(), nacks)
	}
	if _, err := h(with("1", "p")); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*message.Message{with("2", "p", "permanent", "yes"), with("1", "other"), with("", "p")} {
		if _, err := h(m); err != nil {
			t.Fatalf("%s: %v, want nil (dead-lettered, acked)", m.UUID, err)
		}
	}
	want := map[string]string{"uuid-1-p": "failed after 3 attempt", "uuid-2-p": "bad order", "uuid-1-other": "fingerprint", "uuid--p": "no idempotency key"}
	for range len(want) {
		var dl *message.Message
		select {
		case dl = <-dead:
		case <-time.After(5 * time.Second):
			t.Fatal("missing dead letters")
		}
		dl.Ack()
		orig := dl.Metadata.Get(watermillidem.MetadataOriginalUUID)
		reason := dl.Metadata.Get(middleware.ReasonForPoisonedKey)
		if w, ok := want[orig]; !ok || !contains(reason, w) {
			t.Fatalf("dead letter of %q with reason %q", orig, reason)
		}
		delete(want, orig)
	}
	select {
	case dl := <-dead:
		t.Fatalf("a second dead letter: %s", dl.Metadata.Get(watermillidem.MetadataOriginalUUID))
	case <-time.After(200 * time.Millisecond):
	}
	if st := d.Stats(); st.DeadLettered != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestPoisonWithoutDeadLetter: without a dead-letter topic a message that
// failed for good is nacked with an error IsPoison recognises, which
// Watermill's PoisonQueueWithFilter, placed outside, publishes and acks.
func TestPoisonWithoutDeadLetter(t *testing.T) {
	ps := goChannel(t)
	poisoned, err := ps.Subscribe(t.Context(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	d := newDedup(t, watermillidem.Config{Guard: newGuard(t, newStore(t))})
	inner := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, idem.Permanent(errors.New("bad"))
	})
	if _, err := inner(msg("a", "p")); !watermillidem.IsPoison(err) || !errors.Is(err, idem.ErrFailed) {
		t.Fatalf("permanent failure without a dead-letter topic: %v, want IsPoison", err)
	}
	pq, err := middleware.PoisonQueueWithFilter(ps, "poison", watermillidem.IsPoison)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pq(inner)(msg("a", "p")); err != nil {
		t.Fatalf("through PoisonQueueWithFilter: %v, want nil (published and acked)", err)
	}
	select {
	case m := <-poisoned:
		m.Ack()
		if m.UUID != "a" {
			t.Fatalf("poison queue got %s", m.UUID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing on the poison topic")
	}
}

// TestStoreDownFailsClosed: while the store is down the handler does not
// run and the message is nacked; when it is back the message is handled.
func TestStoreDownFailsClosed(t *testing.T) {
	fs := faultstore.New(newStore(t))
	d := newDedup(t, watermillidem.Config{Guard: newGuard(t, fs)})
	var runs atomic.Int64
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return nil, nil
	})
	fs.SetDown(true)
	if _, err := h(msg("a", "p")); !errors.Is(err, idem.ErrUnavailable) || runs.Load() != 0 {
		t.Fatalf("store down: %v, %d runs; want ErrUnavailable and no run", err, runs.Load())
	}
	fs.SetDown(false)
	if _, err := h(msg("a", "p")); err != nil || runs.Load() != 1 {
		t.Fatalf("store back: %v, %d runs", err, runs.Load())
	}
	if st := d.Stats(); st.StoreErrors != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestUnreachableHandlerHoldsClaim: a handler whose own system refuses
// connections is run again under the same claim (no attempt spent, no
// nack) until it succeeds; with MaxAttempts 2 a release per failure would
// have dead-lettered it.
func TestUnreachableHandlerHoldsClaim(t *testing.T) {
	store := newStore(t)
	d := newDedup(t, watermillidem.Config{Guard: newGuard(t, store, idem.WithMaxAttempts(2)), HoldWait: 20 * time.Millisecond})
	var runs atomic.Int64
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		if runs.Add(1) <= 4 {
			return nil, refused
		}
		return nil, nil
	})
	if _, err := h(msg("a", "p")); err != nil {
		t.Fatalf("held through 4 refusals: %v, want nil", err)
	}
	rec, err := store.Get(context.Background(), []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 5 || rec.Attempts != 1 || rec.State != idem.StateCompleted {
		t.Fatalf("%d runs, record %+v; want 5 runs under one claim", runs.Load(), rec)
	}
	if st := d.Stats(); st.Holds != 4 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTakenOverIsNotAcked (F3): a handler that outlives its lease (no
// heartbeat) while another worker takes the key over gets its completion
// fenced: the message is nacked, never acked. The handler's context
// carried its claim's fencing token.
func TestTakenOverIsNotAcked(t *testing.T) {
	store := newStore(t)
	guard := newGuard(t, store, idem.WithLease(100*time.Millisecond), idem.WithHeartbeat(-1))
	d := newDedup(t, watermillidem.Config{Guard: guard})
	other := newGuard(t, store)
	var token uint64
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		token, _ = watermillidem.TokenFromContext(m.Context())
		time.Sleep(200 * time.Millisecond)
		held, _, err := other.Acquire(context.Background(), []byte("a"))
		if err != nil || held == nil {
			return nil, fmt.Errorf("takeover failed: %v", err)
		}
		return nil, held.Complete(context.Background(), nil)
	})
	_, err := h(msg("a", "p"))
	if !errors.Is(err, idem.ErrFenced) {
		t.Fatalf("completion after a takeover: %v, want ErrFenced (a nack)", err)
	}
	if token == 0 {
		t.Fatal("no fencing token in the handler's context")
	}
	if st := d.Stats(); st.LeaseLost != 1 || st.Handled != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLeaseLossCancelsHandler: when the heartbeat finds the claim gone, the
// handler's context is cancelled with idem.ErrLeaseLost.
func TestLeaseLossCancelsHandler(t *testing.T) {
	store := newStore(t)
	guard := newGuard(t, store, idem.WithLease(300*time.Millisecond), idem.WithHeartbeat(50*time.Millisecond))
	d := newDedup(t, watermillidem.Config{Guard: guard})
	h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if err := store.Delete(context.Background(), []byte("a")); err != nil {
			return nil, err
		}
		select {
		case <-m.Context().Done():
			return nil, context.Cause(m.Context())
		case <-time.After(10 * time.Second):
			return nil, errors.New("not cancelled")
		}
	})
	if _, err := h(msg("a", "p")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("handler of a lost claim: %v, want ErrLeaseLost", err)
	}
}

// TestKeys: the UUID by default, a metadata field when configured, and a
// message without one takes the poison path.
func TestKeys(t *testing.T) {
	if k, err := watermillidem.MessageUUID(msg("id-1", "")); err != nil || string(k) != "id-1" {
		t.Fatalf("MessageUUID: %q, %v", k, err)
	}
	if _, err := watermillidem.MessageUUID(msg("", "")); !errors.Is(err, watermillidem.ErrNoKey) {
		t.Fatalf("empty UUID: %v", err)
	}
	m := msg("x", "")
	m.Metadata.Set("order_id", "42")
	if k, err := watermillidem.KeyFromMetadata("order_id")(m); err != nil || string(k) != "42" {
		t.Fatalf("KeyFromMetadata: %q, %v", k, err)
	}
	if _, err := watermillidem.KeyFromMetadata("missing")(m); !errors.Is(err, watermillidem.ErrNoKey) {
		t.Fatalf("missing field: %v", err)
	}
	d := newDedup(t, watermillidem.Config{Guard: newGuard(t, newStore(t))})
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := h(msg("", "p")); !watermillidem.IsPoison(err) || !errors.Is(err, watermillidem.ErrNoKey) {
		t.Fatalf("no key: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	g := newGuard(t, newStore(t))
	for _, tc := range []struct {
		cfg watermillidem.Config
		ok  bool
	}{
		{watermillidem.Config{Guard: g}, true},
		{watermillidem.Config{}, false},
		{watermillidem.Config{Guard: g, DeadLetter: goChannel(t)}, false},
		{watermillidem.Config{Guard: g, DeadLetterTopic: "dlq"}, false},
		{watermillidem.Config{Guard: g, RetryWait: -1}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok || (err != nil && !errors.Is(err, idem.ErrInvalidArgument)) {
			t.Errorf("%+v: %v", tc.cfg, err)
		}
	}
}
