package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

// The guard runs the handler once per key however often the message comes.
func ExampleGuard_Do() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store, idem.WithLease(30*time.Second), idem.WithTTL(72*time.Hour))

	charge := func(ctx context.Context) ([]byte, error) {
		fmt.Println("charging order 1001")
		return []byte(`{"charge_id":"ch_1"}`), nil
	}
	for delivery := 1; delivery <= 3; delivery++ {
		res, err := guard.Do(context.Background(), []byte("order-1001:charge"), charge)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Printf("delivery %d: %s replayed=%v\n", delivery, res.Value, res.Replayed)
	}
	// Output:
	// charging order 1001
	// delivery 1: {"charge_id":"ch_1"} replayed=false
	// delivery 2: {"charge_id":"ch_1"} replayed=true
	// delivery 3: {"charge_id":"ch_1"} replayed=true
}

// A consumer decides what to do with the message from the error.
func ExampleGuard_Do_errors() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store, idem.WithMaxAttempts(2))

	held, _, _ := guard.Acquire(context.Background(), []byte("busy")) // another worker holds it
	defer held.Complete(context.Background(), nil)

	for _, key := range []string{"busy", "flaky", "flaky"} {
		_, err := guard.Do(context.Background(), []byte(key), func(ctx context.Context) ([]byte, error) {
			return nil, errors.New("payment gateway timeout")
		})
		switch {
		case errors.Is(err, idem.ErrInProgress):
			fmt.Println(key, "-> in progress elsewhere: nak with delay, do not ack")
		case errors.Is(err, idem.ErrFailed):
			fmt.Println(key, "-> attempts exhausted: dead-letter once, then ack")
		case errors.Is(err, idem.ErrUnavailable):
			fmt.Println(key, "-> store down: nak with backoff (fail closed)")
		case err != nil:
			fmt.Println(key, "-> handler failed, key released: nak for redelivery")
		}
	}
	// Output:
	// busy -> in progress elsewhere: nak with delay, do not ack
	// flaky -> handler failed, key released: nak for redelivery
	// flaky -> attempts exhausted: dead-letter once, then ack
}

// The same key with another payload is refused instead of replaying another
// message's result.
func ExampleWithFingerprint() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store)
	do := func(payload string) error {
		_, err := guard.Do(context.Background(), []byte("msg-7"), func(ctx context.Context) ([]byte, error) {
			return []byte("ok"), nil
		}, idem.WithFingerprint(idem.FingerprintOf([]byte(payload))))
		return err
	}
	fmt.Println(do(`{"amount":100}`))
	fmt.Println(do(`{"amount":100}`))
	fmt.Println(errors.Is(do(`{"amount":999}`), idem.ErrFingerprintMismatch))
	// Output:
	// <nil>
	// <nil>
	// true
}

// Acquire hands the claim to the caller, for batch consumers that settle
// many keys after one effect.
func ExampleGuard_AcquireBatch() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(store)
	ctx := context.Background()

	items := []idem.BatchItem{{Key: []byte("m1")}, {Key: []byte("m2")}, {Key: []byte("m1")}}
	acqs, err := guard.AcquireBatch(ctx, items) // one store round-trip
	if err != nil {
		fmt.Println("store down:", err)
		return
	}
	for i, a := range acqs {
		switch {
		case a.Held != nil:
			// ... apply the effect, then:
			a.Held.Complete(ctx, nil)
			fmt.Printf("%s: applied\n", items[i].Key)
		case a.Result.Replayed:
			fmt.Printf("%s: duplicate, already done\n", items[i].Key)
		default:
			fmt.Printf("%s: %v\n", items[i].Key, errors.Is(a.Err, idem.ErrInProgress))
		}
	}
	// Output:
	// m1: applied
	// m2: applied
	// m1: true
}

// Hooks plug metrics in; a field left nil is skipped, and a misspelled one
// does not compile.
func ExampleHooks() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	var claims, replays int
	guard, _ := idem.NewGuard(store, idem.WithHooks(idem.Hooks{
		OnClaim: func(ctx context.Context, e idem.ClaimEvent) {
			claims++
			if e.Outcome == idem.OutcomeCompleted {
				replays++
			}
		},
		OnUnrecorded: func(ctx context.Context, e idem.UnrecordedEvent) {
			fmt.Println("completion", e.Phase, "for", string(e.Key))
		},
	}))
	defer guard.Close()
	for i := 0; i < 3; i++ {
		guard.Do(context.Background(), []byte("order-7"), func(ctx context.Context) ([]byte, error) { return nil, nil })
	}
	fmt.Println(claims, "claims,", replays, "replays")
	// Output:
	// 3 claims, 2 replays
}

// A handler whose effect talks to a database sees that database's errors;
// classify them so an outage is retried instead of counted as a failure.
func ExampleClassifyError() {
	_, err := net.Dial("tcp", "127.0.0.1:1") // nothing listens there
	err = idem.ClassifyError(err)
	fmt.Println(errors.Is(err, idem.ErrUnavailable), errors.Is(err, idem.ErrUnknownOutcome))
	err = idem.ClassifyError(fmt.Errorf("reading reply: %w", io.ErrUnexpectedEOF))
	fmt.Println(errors.Is(err, idem.ErrUnavailable), errors.Is(err, idem.ErrUnknownOutcome))
	// Output:
	// true false
	// false true
}
