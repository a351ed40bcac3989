package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/outbox"
)

func (s *suite) harness(t testing.TB) Harness {
	h := s.f(t)
	if h.Crash == nil {
		h.Crash = func(b outbox.Batch) { _ = b.Release(context.Background()) }
	}
	return h
}

// enqueue runs one business transaction holding msgs and commits it (or
// rolls it back).
func enqueue(t testing.TB, h Harness, commit bool, msgs ...outbox.Message) []string {
	t.Helper()
	ctx := ctxT(t)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	ids, err := tx.Enqueue(ctx, msgs...)
	if err != nil {
		_ = tx.Rollback(ctx)
		t.Fatalf("Enqueue: %v", err)
	}
	if len(ids) != len(msgs) {
		t.Fatalf("Enqueue returned %d ids for %d messages", len(ids), len(msgs))
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
	} else if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	return ids
}

func msgN(i int) outbox.Message {
	return outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "key-%d", i), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
}

func msgs(n int) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		out[i] = msgN(i)
	}
	return out
}

// later is a time after every enqueue of the test (the backend's clock is
// this machine's).
func later() time.Time { return time.Now().Add(time.Hour).Truncate(time.Millisecond) }

func claim(t testing.TB, h Harness, req outbox.ClaimRequest) outbox.Batch {
	t.Helper()
	if req.Limit == 0 {
		req.Limit = 1000
	}
	b, err := h.Backend.Claim(ctxT(t), req)
	if err != nil {
		t.Fatalf("Claim(%+v): %v", req, err)
	}
	t.Cleanup(func() { _ = b.Release(context.Background()) })
	return b
}

func ids(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func seqsOf(rows []outbox.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.Seq
	}
	return out
}

func settle(t testing.TB, b outbox.Batch, s outbox.Settlement) {
	t.Helper()
	if err := b.Settle(ctxT(t), s); err != nil {
		t.Fatalf("Settle: %v", err)
	}
}

func sentAll(b outbox.Batch, now time.Time) outbox.Settlement {
	return outbox.Settlement{Now: now, Sent: seqsOf(b.Rows())}
}

func wantIDs(t testing.TB, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: ids %v, want %v", what, got, want)
	}
}

func (s *suite) testRoundTrip(t *testing.T) {
	h := s.harness(t)
	before := time.Now().Add(-time.Minute)
	in := []outbox.Message{
		{ID: "rt-1", Topic: "orders.created", Key: []byte("order-1"), Payload: []byte(`{"a":1}`),
			Headers: map[string]string{"content-type": "application/json", "bin\x00ary": "v\xff\x00", "empty": ""}},
		{ID: "rt-2", Topic: "t", Key: nil, Payload: nil},
		{ID: "rt-3", Topic: strings.Repeat("t", outbox.MaxTopicLen), Key: bytes.Repeat([]byte{0, 0xff}, outbox.MaxKeyLen/2),
			Payload: bytes.Repeat([]byte("p\x00"), 50000)},
	}
	got := enqueue(t, h, true, in...)
	wantIDs(t, "Enqueue", got, []string{"rt-1", "rt-2", "rt-3"})
	b := claim(t, h, outbox.ClaimRequest{Now: later()})
	rows := b.Rows()
	wantIDs(t, "Claim", ids(rows), got)
	for i, r := range rows {
		m := in[i]
		if r.Topic != m.Topic || !bytes.Equal(r.Key, m.Key) || !bytes.Equal(r.Payload, m.Payload) || !maps.Equal(r.Headers, m.Headers) {
			t.Fatalf("row %d = %+v, want message %+v", i, r.Message, m)
		}
		if r.Status != outbox.StatusPending || r.Attempts != 0 || r.LastError != "" {
			t.Fatalf("row %d: status %s attempts %d last error %q", i, r.Status, r.Attempts, r.LastError)
		}
		if r.CreatedAt.Before(before) || r.NextAttemptAt.Before(before) || r.CreatedAt.After(later()) {
			t.Fatalf("row %d: created %v next %v, want about now", i, r.CreatedAt, r.NextAttemptAt)
		}
		if i > 0 && r.Seq <= rows[i-1].Seq {
			t.Fatalf("seqs %v not increasing in enqueue order", seqsOf(rows))
		}
	}
	settle(t, b, sentAll(b, later()))
	if rows := claim(t, h, outbox.ClaimRequest{Now: later().Add(time.Hour)}).Rows(); len(rows) != 0 {
		t.Fatalf("sent rows claimed again: %v", ids(rows))
	}
}

func (s *suite) testGeneratedID(t *testing.T) {
	h := s.harness(t)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := broker.ContextWithTrace(ctxT(t), broker.TraceContext{TraceParent: tp, TraceState: "k=v"})
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	own := "00-11111111111111111111111111111111-2222222222222222-01"
	got, err := tx.Enqueue(ctx, outbox.Message{Topic: "a"}, outbox.Message{Topic: "b", Headers: map[string]string{broker.HeaderTraceParent: own}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] == "" || got[1] == "" || got[0] == got[1] {
		t.Fatalf("generated ids %q", got)
	}
	rows := claim(t, h, outbox.ClaimRequest{Now: later()}).Rows()
	wantIDs(t, "Claim", ids(rows), got)
	if rows[0].Headers[broker.HeaderTraceParent] != tp || rows[0].Headers[broker.HeaderTraceState] != "k=v" {
		t.Fatalf("trace context not carried from the context: %v", rows[0].Headers)
	}
	if rows[1].Headers[broker.HeaderTraceParent] != own {
		t.Fatalf("a message's own traceparent was replaced: %v", rows[1].Headers)
	}
}

// testInvalid: bad messages fail with idem.ErrInvalidArgument before any
// I/O, so the business transaction is intact and commits the rest.
func (s *suite) testInvalid(t *testing.T) {
	h := s.harness(t)
	ctx := ctxT(t)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A failing check must not leave the transaction (and its pool
	// connection) open: the harness's cleanup would wait for it.
	defer func() { _ = tx.Rollback(context.Background()) }()
	for _, m := range []outbox.Message{
		{ID: "x", Topic: ""},
		{ID: strings.Repeat("i", outbox.MaxIDLen+1), Topic: "t"},
		{ID: "x", Topic: strings.Repeat("t", outbox.MaxTopicLen+1)},
		{ID: "x", Topic: "t", Key: make([]byte, outbox.MaxKeyLen+1)},
		{ID: "x", Topic: "t", Payload: make([]byte, outbox.MaxPayloadLen+1)},
		{ID: "x", Topic: "t", Headers: map[string]string{"h": strings.Repeat("v", outbox.MaxHeadersLen)}},
		// IDs and topics are text (a PostgreSQL text column, a header
		// value, a subject): NUL and invalid UTF-8 are refused up front,
		// not by the server after the transaction went wrong.
		{ID: "a\x00b", Topic: "t"},
		{ID: "a\xffb", Topic: "t"},
		{ID: "x", Topic: "t\x00"},
		{ID: "x", Topic: "t\xc3"},
	} {
		if _, err := tx.Enqueue(ctx, outbox.Message{ID: "ok-before", Topic: "t"}, m); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Fatalf("Enqueue(%.60q...): %v, want ErrInvalidArgument", fmt.Sprint(m), err)
		}
	}
	if _, err := tx.Enqueue(ctx, outbox.Message{ID: "ok", Topic: "t"}); err != nil {
		t.Fatalf("the transaction did not survive refused messages: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "Claim", ids(claim(t, h, outbox.ClaimRequest{Now: later()}).Rows()), []string{"ok"})
	if _, err := h.Backend.Claim(ctx, outbox.ClaimRequest{Limit: 0}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("Claim limit 0: %v", err)
	}
}

// testLargeEnqueue: one Enqueue call may hold several messages at the
// payload limit (the limits are per message): they are written in the
// caller's transaction and round-trip byte for byte. MariaDB's default
// max_allowed_packet is 16 MiB, which one INSERT of them all exceeds.
func (s *suite) testLargeEnqueue(t *testing.T) {
	h := s.harness(t)
	var in []outbox.Message
	for i := range 5 {
		p := bytes.Repeat([]byte{byte(i), 0xff, 0}, outbox.MaxPayloadLen/3)
		in = append(in, outbox.Message{Topic: "big", Key: []byte{byte(i)}, Payload: p})
	}
	got := enqueue(t, h, true, in...)
	b := claim(t, h, outbox.ClaimRequest{Limit: 10, Now: later()})
	rows := b.Rows()
	wantIDs(t, "Claim", ids(rows), got)
	for i, r := range rows {
		if !bytes.Equal(r.Payload, in[i].Payload) || !bytes.Equal(r.Key, in[i].Key) {
			t.Fatalf("row %d: payload of %d bytes, key %q; want %d bytes, key %q", i, len(r.Payload), r.Key, len(in[i].Payload), in[i].Key)
		}
	}
	settle(t, b, sentAll(b, later()))
}

func (s *suite) testDuplicateID(t *testing.T) {
	h := s.harness(t)
	enqueue(t, h, true, outbox.Message{ID: "dup", Topic: "t"})
	ctx := ctxT(t)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Enqueue(ctx, outbox.Message{ID: "dup", Topic: "t2"}); !errors.Is(err, outbox.ErrDuplicateID) {
		t.Fatalf("second enqueue of one id: %v, want ErrDuplicateID", err)
	}
	_ = tx.Rollback(ctx)
	rows := claim(t, h, outbox.ClaimRequest{Now: later()}).Rows()
	if len(rows) != 1 || rows[0].Topic != "t" {
		t.Fatalf("rows %+v, want the first message only", rows)
	}
}

func (s *suite) testRollback(t *testing.T) {
	h := s.harness(t)
	enqueue(t, h, false, msgs(5)...)
	if rows := claim(t, h, outbox.ClaimRequest{Now: later()}).Rows(); len(rows) != 0 {
		t.Fatalf("rolled-back messages claimed: %v", ids(rows))
	}
	rec := NewRecorder()
	relay := newRelay(t, outbox.Config{Backend: h.Backend, Publisher: rec})
	if n, err := relay.RunOnce(ctxT(t)); n != 0 || err != nil || rec.Total() != 0 {
		t.Fatalf("relay after a rollback: %d rows, %v, %d published", n, err, rec.Total())
	}
	// The ids of a rolled-back transaction are free again.
	enqueue(t, h, true, outbox.Message{ID: "again", Topic: "t"})
}

// testClaimSkipLocked: claims come in (NextAttemptAt, Seq) order up to the
// limit; a second claim skips the rows the first holds instead of waiting;
// released rows come back unchanged.
func (s *suite) testClaimSkipLocked(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(10)...)
	now := later()
	a := claim(t, h, outbox.ClaimRequest{Limit: 4, Now: now})
	wantIDs(t, "first claim", ids(a.Rows()), all[:4])
	done := make(chan outbox.Batch, 1)
	go func() {
		b, err := h.Backend.Claim(context.Background(), outbox.ClaimRequest{Limit: 4, Now: now})
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	var b outbox.Batch
	select {
	case b = <-done:
	case <-time.After(s.feat.Timeout):
		t.Fatal("a second claim waited for the first one's rows instead of skipping them")
	}
	if b == nil {
		t.FailNow()
	}
	t.Cleanup(func() { _ = b.Release(context.Background()) })
	wantIDs(t, "second claim", ids(b.Rows()), all[4:8])
	if err := a.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctxT(t)); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	c := claim(t, h, outbox.ClaimRequest{Limit: 10, Now: now})
	wantIDs(t, "after release", ids(c.Rows()), append(append([]string{}, all[:4]...), all[8:]...))
	for _, r := range c.Rows() {
		if r.Attempts != 0 {
			t.Fatalf("a released row counts an attempt: %+v", r)
		}
	}
}

// testOutOfOrderCommit: a transaction that enqueued first (smaller Seq)
// commits after one that enqueued later; its message is still claimed. A
// relay keeping a cursor on Seq would skip it for ever.
func (s *suite) testOutOfOrderCommit(t *testing.T) {
	if !s.feat.ConcurrentTx {
		t.Skip("business transactions of this backend cannot overlap")
	}
	h := s.harness(t)
	ctx := ctxT(t)
	tx1, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	if _, err := tx1.Enqueue(ctx, outbox.Message{ID: "first-enqueued", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	enqueue(t, h, true, outbox.Message{ID: "second-enqueued", Topic: "t"})
	b := claim(t, h, outbox.ClaimRequest{Now: later()})
	wantIDs(t, "before the first commit", ids(b.Rows()), []string{"second-enqueued"})
	settle(t, b, sentAll(b, later()))
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c := claim(t, h, outbox.ClaimRequest{Now: later()})
	wantIDs(t, "after the first commit", ids(c.Rows()), []string{"first-enqueued"})
	if c.Rows()[0].Seq >= b.Rows()[0].Seq {
		t.Fatalf("seqs %d, %d: the test did not commit out of order", c.Rows()[0].Seq, b.Rows()[0].Seq)
	}
}

// testSettle: sent rows are done; a retried row comes back at Now+Delay
// (not before) with its attempt and error; a failed row is listed, not
// claimed; the rows not named are freed unchanged.
func (s *suite) testSettle(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(4)...)
	t0 := later()
	b := claim(t, h, outbox.ClaimRequest{Now: t0})
	r := b.Rows()
	settle(t, b, outbox.Settlement{Now: t0,
		Sent:   []int64{r[0].Seq},
		Retry:  []outbox.Retry{{Seq: r[1].Seq, Delay: 10 * time.Second, Err: "broker said no"}},
		Failed: []outbox.Failure{{Seq: r[2].Seq, Err: "gave up"}},
	}) // r[3] not named: freed unchanged
	c := claim(t, h, outbox.ClaimRequest{Now: t0.Add(5 * time.Second)})
	wantIDs(t, "5s later", ids(c.Rows()), all[3:4])
	if c.Rows()[0].Attempts != 0 {
		t.Fatalf("a row not named in Settle counts an attempt: %+v", c.Rows()[0])
	}
	settle(t, c, sentAll(c, t0))
	d := claim(t, h, outbox.ClaimRequest{Now: t0.Add(10 * time.Second)})
	wantIDs(t, "10s later", ids(d.Rows()), all[1:2])
	got := d.Rows()[0]
	if got.Attempts != 1 || got.LastError != "broker said no" || !got.NextAttemptAt.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("retried row %+v: want attempts 1, error, next attempt at %v", got, t0.Add(10*time.Second))
	}
	_ = d.Release(ctxT(t))
	failed, err := h.Backend.ListFailed(ctxT(t), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if wantIDs(t, "failed", ids(failed), all[2:3]); failed[0].Attempts != 1 || failed[0].LastError != "gave up" || failed[0].Status != outbox.StatusFailed {
		t.Fatalf("failed row %+v", failed[0])
	}
	if !failed[0].UpdatedAt.Equal(t0) {
		t.Fatalf("failed row updated at %v, want the settlement's %v", failed[0].UpdatedAt, t0)
	}
}

func (s *suite) testSettleInvalid(t *testing.T) {
	h := s.harness(t)
	enqueue(t, h, true, msgs(2)...)
	b := claim(t, h, outbox.ClaimRequest{Limit: 1, Now: later()})
	seq := b.Rows()[0].Seq
	for name, st := range map[string]outbox.Settlement{
		"foreign seq": {Sent: []int64{seq + 1000}},
		"named twice": {Sent: []int64{seq}, Failed: []outbox.Failure{{Seq: seq, Err: "x"}}},
	} {
		if err := b.Settle(ctxT(t), st); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Fatalf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	settle(t, b, sentAll(b, later()))
	if err := b.Settle(ctxT(t), sentAll(b, later())); !errors.Is(err, outbox.ErrBatchEnded) {
		t.Fatalf("second Settle: %v, want ErrBatchEnded", err)
	}
	rows := claim(t, h, outbox.ClaimRequest{Now: later()}).Rows()
	if len(rows) != 1 || rows[0].Seq == seq {
		t.Fatalf("after the refused settlements: %+v", rows)
	}
}

// testSettleErrorText: a publish error's text is whatever the broker
// client said, which may hold NUL bytes, invalid UTF-8 (a key or payload
// quoted into the message) or far more than MaxErrorLen. Settle stores it
// (as TruncateError makes it) instead of failing: a settlement that fails
// for its error text frees the batch unchanged, so the bad row never
// counts an attempt, the batch's published rows are published again on
// every round, and the same rows are claimed for ever.
func (s *suite) testSettleErrorText(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(3)...)
	t0 := later()
	b := claim(t, h, outbox.ClaimRequest{Now: t0})
	r := b.Rows()
	nasty := "publish k\x00ey \x00\xff\xfe\xc3 refused: " + strings.Repeat("é", outbox.MaxErrorLen)
	settle(t, b, outbox.Settlement{Now: t0,
		Sent:   []int64{r[0].Seq},
		Retry:  []outbox.Retry{{Seq: r[1].Seq, Delay: time.Second, Err: nasty}},
		Failed: []outbox.Failure{{Seq: r[2].Seq, Err: "gave up: \x00\xff"}},
	})
	check := func(what string, row outbox.Row, prefix string) {
		t.Helper()
		if row.Attempts != 1 {
			t.Fatalf("%s: attempts %d, want 1", what, row.Attempts)
		}
		le := row.LastError
		if !utf8.ValidString(le) || strings.IndexByte(le, 0) >= 0 || len(le) > outbox.MaxErrorLen || !strings.HasPrefix(le, prefix) {
			t.Fatalf("%s: last error %q (%d bytes): want valid UTF-8 without NUL, at most %d bytes, starting %q", what, le, len(le), outbox.MaxErrorLen, prefix)
		}
		if le != outbox.TruncateError(le) {
			t.Fatalf("%s: last error %q is not what TruncateError keeps", what, le)
		}
	}
	c := claim(t, h, outbox.ClaimRequest{Now: t0.Add(time.Second)})
	wantIDs(t, "retried", ids(c.Rows()), all[1:2])
	check("retried row", c.Rows()[0], "publish k")
	_ = c.Release(ctxT(t))
	failed, err := h.Backend.ListFailed(ctxT(t), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "failed", ids(failed), all[2:3])
	check("failed row", failed[0], "gave up: ")
}

// testCrashFreesRows: the claimer dies (after publishing, before
// settling): its rows come back unchanged for the next claimer.
func (s *suite) testCrashFreesRows(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(3)...)
	b := claim(t, h, outbox.ClaimRequest{Now: later()})
	wantIDs(t, "claim", ids(b.Rows()), all)
	h.Crash(b)
	var rows []outbox.Row
	WaitFor(t, "the crashed claim's rows to be claimable", s.feat.Timeout, func() (bool, string) {
		c := claim(t, h, outbox.ClaimRequest{Now: later()})
		rows = c.Rows()
		if len(rows) < 3 {
			_ = c.Release(ctxT(t))
			return false, fmt.Sprintf("%d rows", len(rows))
		}
		return true, ""
	})
	wantIDs(t, "after the crash", ids(rows), all)
	for _, r := range rows {
		if r.Attempts != 0 || r.Status != outbox.StatusPending {
			t.Fatalf("row after a crash: %+v", r)
		}
	}
}

func (s *suite) testListRequeue(t *testing.T) {
	h := s.harness(t)
	all := enqueue(t, h, true, msgs(5)...)
	now := later()
	b := claim(t, h, outbox.ClaimRequest{Now: now})
	var fails []outbox.Failure
	for _, r := range b.Rows() {
		fails = append(fails, outbox.Failure{Seq: r.Seq, Err: "down " + r.ID})
	}
	settle(t, b, outbox.Settlement{Now: now, Failed: fails})
	if rows := claim(t, h, outbox.ClaimRequest{Now: now.Add(time.Hour)}).Rows(); len(rows) != 0 {
		t.Fatalf("failed rows claimed: %v", ids(rows))
	}
	ctx := ctxT(t)
	page1, err := h.Backend.ListFailed(ctx, 0, 3)
	if err != nil || len(page1) != 3 {
		t.Fatalf("ListFailed: %d rows, %v; want 3", len(page1), err)
	}
	page2, err := h.Backend.ListFailed(ctx, page1[len(page1)-1].Seq, 3)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "failed pages", append(ids(page1), ids(page2)...), all)
	if page2[1].LastError != "down "+all[4] {
		t.Fatalf("last error %q", page2[1].LastError)
	}
	n, err := h.Backend.Requeue(ctx, []string{all[1], all[3], "no-such-id"})
	if err != nil || n != 2 {
		t.Fatalf("Requeue = %d, %v; want 2", n, err)
	}
	c := claim(t, h, outbox.ClaimRequest{Now: later().Add(time.Hour)})
	wantIDs(t, "requeued", ids(c.Rows()), []string{all[1], all[3]})
	for _, r := range c.Rows() {
		if r.Attempts != 0 || r.Status != outbox.StatusPending {
			t.Fatalf("requeued row %+v: want pending with attempts 0", r)
		}
	}
	settle(t, c, sentAll(c, now))
	if n, err := h.Backend.Requeue(ctx, []string{all[1]}); n != 0 || err != nil {
		t.Fatalf("Requeue of a sent row = %d, %v; want 0", n, err)
	}
	if left, _ := h.Backend.ListFailed(ctx, 0, 10); len(left) != 3 {
		t.Fatalf("%d failed rows left, want 3", len(left))
	}
}

func (s *suite) testPurge(t *testing.T) {
	h := s.harness(t)
	enqueue(t, h, true, msgs(8)...)
	t0 := later()
	old, recent := t0.Add(-2*time.Hour), t0
	b := claim(t, h, outbox.ClaimRequest{Limit: 4, Now: t0})
	settle(t, b, sentAll(b, old)) // 4 sent long ago
	c := claim(t, h, outbox.ClaimRequest{Limit: 2, Now: t0})
	settle(t, c, sentAll(c, recent)) // 2 sent recently
	d := claim(t, h, outbox.ClaimRequest{Limit: 1, Now: t0})
	settle(t, d, outbox.Settlement{Now: old, Failed: []outbox.Failure{{Seq: d.Rows()[0].Seq, Err: "x"}}}) // 1 failed, 1 pending
	ctx := ctxT(t)
	cut := t0.Add(-time.Hour)
	if n, err := h.Backend.PurgeSent(ctx, cut, 3); n != 3 || err != nil {
		t.Fatalf("PurgeSent(limit 3) = %d, %v", n, err)
	}
	if n, err := h.Backend.PurgeSent(ctx, cut, 100); n != 1 || err != nil {
		t.Fatalf("PurgeSent(rest) = %d, %v; want 1", n, err)
	}
	if n, err := h.Backend.PurgeSent(ctx, cut, 100); n != 0 || err != nil {
		t.Fatalf("PurgeSent(again) = %d, %v; want 0", n, err)
	}
	if n, err := h.Backend.PurgeSent(ctx, t0.Add(time.Hour), 100); n != 2 || err != nil {
		t.Fatalf("PurgeSent(recent) = %d, %v; want 2", n, err)
	}
	st, err := h.Backend.Stats(ctx)
	if err != nil || st.Pending != 1 || st.Failed != 1 {
		t.Fatalf("after purging: %+v, %v; want the pending and failed rows kept", st, err)
	}
}

func (s *suite) testStats(t *testing.T) {
	h := s.harness(t)
	ctx := ctxT(t)
	st, err := h.Backend.Stats(ctx)
	if err != nil || st.Pending != 0 || st.Failed != 0 || !st.OldestPending.IsZero() || st.OldestAge() != 0 {
		t.Fatalf("empty outbox: %+v, %v", st, err)
	}
	before := time.Now().Add(-time.Minute)
	enqueue(t, h, true, msgs(3)...)
	enqueue(t, h, true, msgN(3))
	b := claim(t, h, outbox.ClaimRequest{Limit: 1, Now: later()})
	settle(t, b, outbox.Settlement{Failed: []outbox.Failure{{Seq: b.Rows()[0].Seq, Err: "x"}}})
	st, err = h.Backend.Stats(ctx)
	if err != nil || st.Pending != 3 || st.Failed != 1 {
		t.Fatalf("stats %+v, %v; want 3 pending, 1 failed", st, err)
	}
	if st.OldestPending.Before(before) || st.OldestPending.After(time.Now().Add(time.Minute)) || st.At.Before(st.OldestPending) {
		t.Fatalf("oldest pending %v at %v: want about now", st.OldestPending, st.At)
	}
}

// testOrdered: with Ordered, a key's later message is claimed only once
// the earlier one is sent or failed, also while the earlier one waits for
// a retry or is held by another claim; other keys and unkeyed messages
// are not held up.
func (s *suite) testOrdered(t *testing.T) {
	h := s.harness(t)
	k := func(id, key string) outbox.Message {
		return outbox.Message{ID: id, Topic: "t", Key: []byte(key)}
	}
	enqueue(t, h, true, k("a1", "A"), k("b1", "B"), k("a2", "A"))
	enqueue(t, h, true, k("a3", "A"), k("n1", ""), k("n2", ""), k("b2", "B"))
	t0 := later()
	b := claim(t, h, outbox.ClaimRequest{Now: t0, Ordered: true})
	wantIDs(t, "heads", ids(b.Rows()), []string{"a1", "b1", "n1", "n2"})
	// While a1 and b1 are held, their keys' later messages wait.
	if rows := claim(t, h, outbox.ClaimRequest{Now: t0, Ordered: true}).Rows(); len(rows) != 0 {
		t.Fatalf("claimed %v while the keys' heads are held", ids(rows))
	}
	r := b.Rows()
	settle(t, b, outbox.Settlement{Now: t0,
		Retry: []outbox.Retry{{Seq: r[0].Seq, Delay: time.Minute, Err: "x"}}, // a1 waits a minute
		Sent:  []int64{r[1].Seq, r[2].Seq, r[3].Seq}})
	c := claim(t, h, outbox.ClaimRequest{Now: t0.Add(time.Second), Ordered: true})
	wantIDs(t, "a1 waiting for its retry", ids(c.Rows()), []string{"b2"})
	settle(t, c, sentAll(c, t0))
	d := claim(t, h, outbox.ClaimRequest{Now: t0.Add(time.Minute), Ordered: true})
	wantIDs(t, "a1 due", ids(d.Rows()), []string{"a1"})
	settle(t, d, outbox.Settlement{Now: t0, Failed: []outbox.Failure{{Seq: d.Rows()[0].Seq, Err: "gave up"}}})
	e := claim(t, h, outbox.ClaimRequest{Now: t0.Add(time.Minute), Ordered: true})
	wantIDs(t, "after a1 failed", ids(e.Rows()), []string{"a2"})
	_ = e.Release(ctxT(t))
	// Without Ordered the same rows are all claimable.
	wantIDs(t, "unordered", ids(claim(t, h, outbox.ClaimRequest{Now: t0.Add(time.Minute)}).Rows()), []string{"a2", "a3"})
}

func (s *suite) testContextCancelled(t *testing.T) {
	h := s.harness(t)
	enqueue(t, h, true, msgs(1)...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b, err := h.Backend.Claim(ctx, outbox.ClaimRequest{Limit: 10, Now: later()}); err == nil {
		_ = b.Release(context.Background())
		t.Fatal("Claim with a cancelled context succeeded")
	}
	if _, err := h.Backend.Stats(ctx); err == nil {
		t.Fatal("Stats with a cancelled context succeeded")
	}
	if rows := claim(t, h, outbox.ClaimRequest{Now: later()}).Rows(); len(rows) != 1 {
		t.Fatalf("after a cancelled claim: %d rows claimable, want 1", len(rows))
	}
}
