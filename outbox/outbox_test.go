package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/memoutbox"
)

// TestBackoffSeedSchedule: the seed's schedule (1s, x1.5, capped at 10s)
// plus at most Jitter of it.
func TestBackoffSeedSchedule(t *testing.T) {
	var b outbox.Backoff // defaults
	for _, tc := range []struct {
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{1, 0, time.Second},
		{2, 0, 1500 * time.Millisecond},
		{3, 0, 2250 * time.Millisecond},
		{6, 0, 7593750 * time.Microsecond},
		{7, 0, 10 * time.Second}, // 11.39s capped
		{100, 0, 10 * time.Second},
		{1, 0.5, 1050 * time.Millisecond},
		{100, 0.999, 10*time.Second + 999*time.Millisecond},
		{0, 0, time.Second},
	} {
		if got := b.Delay(tc.attempt, tc.rnd); got != tc.want {
			t.Errorf("Delay(%d, %v) = %s, want %s", tc.attempt, tc.rnd, got, tc.want)
		}
	}
	noJitter := outbox.Backoff{Jitter: -1}
	if got := noJitter.Delay(1, 0.9); got != time.Second {
		t.Errorf("no jitter: %s", got)
	}
	// A Max whose delay (plus jitter) overflows a Duration came out
	// negative: the row was due at once, a hot retry loop.
	if d := (outbox.Backoff{Max: 200 * 365 * 24 * time.Hour, Multiplier: 1e300, Jitter: 1}).Delay(2, 0.99); d <= 0 {
		t.Errorf("a 200-year Max gave a delay of %s", d)
	}
	for _, bad := range []outbox.Backoff{{Initial: time.Microsecond}, {Multiplier: 0.5}, {Initial: 2 * time.Second, Max: time.Second}, {Jitter: 2},
		{Max: outbox.MaxBackoff + 1}} {
		if err := bad.Validate(); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

func TestPrepare(t *testing.T) {
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := broker.ContextWithTrace(context.Background(), broker.TraceContext{TraceParent: tp})
	in := outbox.Message{Topic: "t", Headers: map[string]string{"a": "b"}}
	m, hdr, err := outbox.Prepare(ctx, in, func() (string, error) { return "id-1", nil })
	if err != nil || m.ID != "id-1" || m.Headers[broker.HeaderTraceParent] != tp || m.Headers["a"] != "b" {
		t.Fatalf("Prepare = %+v, %v", m, err)
	}
	if in.Headers[broker.HeaderTraceParent] != "" || in.ID != "" {
		t.Fatal("Prepare modified its argument")
	}
	if got, err := outbox.DecodeHeaders(hdr); err != nil || !maps.Equal(got, m.Headers) {
		t.Fatalf("encoded headers decode to %v, %v", got, err)
	}
	if _, _, err := outbox.Prepare(ctx, outbox.Message{Topic: "t"}, nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("no id, no NewID: %v", err)
	}
	idErr := errors.New("generator stopped")
	if _, _, err := outbox.Prepare(ctx, outbox.Message{Topic: "t"}, func() (string, error) { return "", idErr }); !errors.Is(err, idErr) {
		t.Fatalf("NewID failing: %v", err)
	}
	if _, _, err := outbox.Prepare(ctx, outbox.Message{ID: "x", Topic: "t", Headers: map[string]string{"h": strings.Repeat("v", outbox.MaxHeadersLen)}}, nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("huge headers: %v", err)
	}
}

func TestTruncateError(t *testing.T) {
	s := strings.Repeat("é", outbox.MaxErrorLen) // 2 bytes each
	got := outbox.TruncateError(s)
	if len(got) > outbox.MaxErrorLen || !strings.HasPrefix(s, got) || strings.ToValidUTF8(got, "?") != got {
		t.Fatalf("truncated to %d bytes, valid=%v", len(got), strings.ToValidUTF8(got, "?") == got)
	}
	if outbox.TruncateError("short") != "short" {
		t.Fatal("short error changed")
	}
	// Bytes a text column refuses become U+FFFD, also before a cut.
	if got := outbox.TruncateError("k\x00ey \xff\xc3!"); got != "k\uFFFDey \uFFFD!" {
		t.Fatalf("TruncateError(NUL, invalid UTF-8) = %q", got)
	}
	got = outbox.TruncateError(strings.Repeat("a\xff", outbox.MaxErrorLen))
	if len(got) > outbox.MaxErrorLen || !utf8.ValidString(got) || got != strings.Repeat("a\uFFFD", outbox.MaxErrorLen/4) {
		t.Fatalf("long invalid error cut to %q (%d bytes)", got, len(got))
	}
}

func TestRelayConfigValidate(t *testing.T) {
	pub := nopPublisher{}
	back := nopBackend{}
	for _, c := range []outbox.Config{
		{Publisher: pub},
		{Backend: back},
		{Backend: back, Publisher: pub, BatchSize: 10001},
		{Backend: back, Publisher: pub, MaxAttempts: -2},
		{Backend: back, Publisher: pub, Retention: time.Millisecond},
		{Backend: back, Publisher: pub, Backoff: outbox.Backoff{Multiplier: 0.1}},
	} {
		if err := c.Validate(); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if err := (outbox.Config{Backend: back, Publisher: pub}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	for _, h := range []map[string]string{nil, {}, {"": ""}, {"a": "1", "b\x00": "\xff\xfe", "traceparent": "x"}} {
		got, err := outbox.DecodeHeaders(outbox.EncodeHeaders(h))
		if err != nil || len(got) != len(h) || !maps.Equal(got, h) && len(h) > 0 {
			t.Fatalf("%q: got %q, %v", h, got, err)
		}
	}
	for _, bad := range [][]byte{{0}, {1}, {2, 1, 'a', 0, 1, 'a', 0}, {1, 5, 'a'}, {1, 0, 0, 9}} {
		if _, err := outbox.DecodeHeaders(bad); err == nil {
			t.Errorf("DecodeHeaders(%v) accepted", bad)
		}
	}
}

// FuzzHeaders: DecodeHeaders never panics; what it accepts re-encodes to
// an encoding that decodes to the same headers.
func FuzzHeaders(f *testing.F) {
	f.Add(outbox.EncodeHeaders(map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := outbox.DecodeHeaders(b)
		if err != nil {
			return
		}
		again, err := outbox.DecodeHeaders(outbox.EncodeHeaders(h))
		if err != nil || !maps.Equal(again, h) {
			t.Fatalf("%q -> %q -> %q, %v", b, h, again, err)
		}
	})
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, ...*broker.Message) error { return nil }
func (nopPublisher) Close() error                                      { return nil }

type nopBackend struct{ outbox.Backend }

// settleDeadlines wraps a backend and records the deadline of every
// Settle's context.
type settleDeadlines struct {
	outbox.Backend
	deadlines chan time.Time
}

func (b settleDeadlines) Claim(ctx context.Context, req outbox.ClaimRequest) (outbox.Batch, error) {
	bt, err := b.Backend.Claim(ctx, req)
	if err != nil {
		return nil, err
	}
	return deadlineBatch{bt, b.deadlines}, nil
}

type deadlineBatch struct {
	outbox.Batch
	deadlines chan time.Time
}

func (b deadlineBatch) Settle(ctx context.Context, s outbox.Settlement) error {
	d, _ := ctx.Deadline()
	b.deadlines <- d
	return b.Batch.Settle(ctx, s)
}

// slowPublisher takes its time, and reports when it was done.
type slowPublisher struct{ done chan time.Time }

func (p slowPublisher) Publish(context.Context, ...*broker.Message) error {
	time.Sleep(2 * time.Millisecond)
	p.done <- time.Now()
	return nil
}
func (slowPublisher) Close() error { return nil }

// TestSettleTimeoutAfterPublish: marking a batch sent gets its whole
// settle timeout from the moment publishing ended. Counted from the claim,
// publishing ate it: a publish taking longer than the settle timeout (a
// PublishTimeout above the default, or a slow broker near the default)
// left the settlement an expired context, the batch was freed unchanged,
// and the same rows were claimed and published again for ever, never
// marked sent and never counting an attempt.
func TestSettleTimeoutAfterPublish(t *testing.T) {
	ob := memoutbox.New(memoutbox.Config{})
	if _, err := ob.Enqueue(context.Background(), outbox.Message{ID: "m1", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	back := settleDeadlines{ob, make(chan time.Time, 1)}
	pub := slowPublisher{make(chan time.Time, 1)}
	r, err := outbox.New(outbox.Config{Backend: back, Publisher: pub, PublishTimeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	published, deadline := <-pub.done, <-back.deadlines
	if left := deadline.Sub(published); left < outbox.DefaultSettleTimeout {
		t.Fatalf("the settlement had %s left after publishing, want the whole %s", left, outbox.DefaultSettleTimeout)
	}
}
