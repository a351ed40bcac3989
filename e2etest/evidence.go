package e2etest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// Evidence: what a failed end-to-end run logs so that the failure says why
// (which claim wrote a duplicated row, what happened to it), not only how
// many rows there are. Each test gets one evidence recorder, shared by its
// NewLedger, NewGuard and Ledger.ConsumerConfig: the guard's unusual events
// (a claim taking a key over or claiming it again, a lease lost, a settle
// the store refused or did not record) and the warnings and errors the
// guard and the consumers log, each kept by key where it names one. The
// ledger's cleanup logs them with the duplicated rows when the test failed
// (Ledger.Explain). Nothing is logged when the test passes.

// Bounds: a run that goes badly wrong raises thousands of events.
const (
	evidenceMaxEvents = 50_000 // kept by key
	evidenceRecent    = 30     // last events (but warnings about a key)
	explainIDs        = 20     // duplicated ids whose rows are logged
	explainEvents     = 30     // events logged per duplicated id
)

type evidence struct {
	mu     sync.Mutex
	byKey  map[string][]string
	stored int
	counts map[string]int
	recent []string // ring of the last evidenceRecent events
	next   int
	start  time.Time
}

var evidences sync.Map // testing.TB -> *evidence

// evidenceFor returns t's recorder, made on first use and forgotten at
// t's cleanup.
func evidenceFor(t testing.TB) *evidence {
	if ev, ok := evidences.Load(t); ok {
		return ev.(*evidence)
	}
	ev, loaded := evidences.LoadOrStore(t, &evidence{byKey: map[string][]string{}, counts: map[string]int{}, start: time.Now()})
	if !loaded {
		t.Cleanup(func() { evidences.Delete(t) })
	}
	return ev.(*evidence)
}

// add records one event of kind about key (empty: none). The last
// events (recent) leave out warnings about a key: a broker connection cut
// raises hundreds, found by key if their key matters.
func (ev *evidence) add(kind, key, text string, warning bool) {
	line := fmt.Sprintf("%s %s", time.Now().Format("15:04:05.000"), text)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.counts[kind]++
	if key != "" && ev.stored < evidenceMaxEvents {
		ev.byKey[key] = append(ev.byKey[key], line)
		ev.stored++
	}
	if key != "" {
		if warning {
			return
		}
		line += " [" + key + "]"
	}
	if len(ev.recent) < evidenceRecent {
		ev.recent = append(ev.recent, line)
	} else {
		ev.recent[ev.next] = line
		ev.next = (ev.next + 1) % evidenceRecent
	}
}

// events returns key's events (at most limit, the first ones).
func (ev *evidence) events(key string, limit int) (lines []string, more int) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	l := ev.byKey[key]
	if len(l) > limit {
		return append([]string(nil), l[:limit]...), len(l) - limit
	}
	return append([]string(nil), l...), 0
}

// summary is the event counts by kind and the last events.
func (ev *evidence) summary() (counts, recent []string) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for k, n := range ev.counts {
		counts = append(counts, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(counts)
	recent = append(recent, ev.recent[ev.next:]...)
	recent = append(recent, ev.recent[:ev.next]...)
	return counts, recent
}

// hooks observe a guard: claims that take a key over or claim it again
// (Attempts > 1), claim errors, settles the store refused, leases lost and
// unrecorded completions.
func (ev *evidence) hooks(src string) idem.Hooks {
	return idem.Hooks{
		OnClaim: func(_ context.Context, e idem.ClaimEvent) {
			switch {
			case e.Err != nil && !errors.Is(e.Err, idem.ErrFingerprintMismatch):
				ev.add("claim error", string(e.Key), fmt.Sprintf("%s: claim error after %s: %v", src, e.Duration.Round(time.Millisecond), e.Err), false)
			case e.Outcome == idem.OutcomeAcquired && e.Attempts > 1:
				// A claim after a release, or a takeover of a lapsed lease.
				ev.add("re-claim", string(e.Key), fmt.Sprintf("%s: claimed again (attempt %d) in %s", src, e.Attempts, e.Duration.Round(time.Millisecond)), false)
			}
		},
		OnSettle: func(_ context.Context, e idem.SettleEvent) {
			switch {
			case e.Err != nil:
				ev.add(e.Action.String()+" error", string(e.Key), fmt.Sprintf("%s: %s token %d refused after %s (held %s): %v",
					src, e.Action, e.Token, e.Duration.Round(time.Millisecond), e.Held.Round(time.Millisecond), e.Err), false)
			case e.Action != idem.SettleComplete:
				ev.add(e.Action.String(), string(e.Key), fmt.Sprintf("%s: %s token %d (held %s)", src, e.Action, e.Token, e.Held.Round(time.Millisecond)), false)
			}
		},
		OnLeaseLost: func(_ context.Context, key []byte, token uint64, err error) {
			ev.add("lease lost", string(key), fmt.Sprintf("%s: lease of token %d lost: %v", src, token, err), false)
		},
		OnUnrecorded: func(_ context.Context, e idem.UnrecordedEvent) {
			ev.add("unrecorded "+e.Phase.String(), string(e.Key), fmt.Sprintf("%s: %s of token %d unrecorded, %s after %d tries (lease window %s): %v",
				src, e.Action, e.Token, e.Phase, e.Tries, e.Window.Round(time.Millisecond), e.Err), false)
		},
		OnFailOpen: func(_ context.Context, key []byte, err error) {
			ev.add("fail-open", string(key), fmt.Sprintf("%s: ran without a record: %v", src, err), false)
		},
	}
}

// logger records warnings and errors (by the key or msg_id they name)
// and drops the rest, as Quiet does: the runs log thousands of expected
// naks and duplicates at lower levels.
func (ev *evidence) logger(src string) *slog.Logger {
	return slog.New(&evidenceHandler{ev: ev, src: src})
}

type evidenceHandler struct {
	ev    *evidence
	src   string
	attrs []slog.Attr
}

func (h *evidenceHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *evidenceHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s %s", h.src, r.Level, r.Message)
	key := ""
	each := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		if (a.Key == "key" || a.Key == "msg_id") && key == "" {
			key = a.Value.String()
		}
		return true
	}
	for _, a := range h.attrs {
		each(a)
	}
	r.Attrs(each)
	h.ev.add(fmt.Sprintf("%s %s %q", h.src, r.Level, r.Message), key, b.String(), r.Level < slog.LevelError)
	return nil
}

func (h *evidenceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &evidenceHandler{ev: h.ev, src: h.src, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

// WithGroup is ignored: the runtime and the guard log flat attributes.
func (h *evidenceHandler) WithGroup(string) slog.Handler { return h }

// Explain logs what a failed run needs to say why: the ledger's counts;
// for the duplicated ids, how their rows differ (one claim's token twice:
// the runtime ran a claim's effect twice; two tokens: a second claim, a
// takeover or a claim after a release; one transaction: the same message
// twice in one batch) and, for the first of them, each row (token,
// delivery, consumer, process, transaction and its size, session, time),
// the key's record in the pgstore of the ledger's schema if there is one,
// and the guard's and the consumers' events about the key; then the
// record states, the ledger pool's figures and the database's sessions by
// state (a store starved of connections, or blocked on locks, says so),
// the goroutines in idem's code grouped by stack (a run that stalls says
// where), the event counts and the last events.
// NewLedger's cleanup calls it when the test failed.
func (l *Ledger) Explain(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Logf("evidence of %s:\n%s", t.Name(), l.explain(ctx))
}

// explain is Explain's text.
func (l *Ledger) explain(ctx context.Context) string {
	var b strings.Builder
	fail := func(what string, err error) { fmt.Fprintf(&b, "  (%s: %v)\n", what, err) }

	var total, distinct, dupIDs, extra, oneToken, twoTokens, noToken, oneTx, members, pids int
	if err := l.Pool.QueryRow(ctx, `WITH d AS (
		SELECT count(*) AS n, count(DISTINCT token) AS tokens, bool_or(token IS NULL) AS untok,
			count(DISTINCT txid) AS txs, count(DISTINCT member) AS members, count(DISTINCT pid) AS pids
		FROM `+l.Table+` GROUP BY msg_id HAVING count(*) > 1)
	SELECT (SELECT count(*) FROM `+l.Table+`), (SELECT count(DISTINCT msg_id) FROM `+l.Table+`),
		count(*), coalesce(sum(n - 1), 0),
		count(*) FILTER (WHERE tokens = 1 AND NOT untok), count(*) FILTER (WHERE tokens > 1),
		count(*) FILTER (WHERE untok), count(*) FILTER (WHERE txs < n),
		count(*) FILTER (WHERE members > 1), count(*) FILTER (WHERE pids > 1)
	FROM d`).Scan(&total, &distinct, &dupIDs, &extra, &oneToken, &twoTokens, &noToken, &oneTx, &members, &pids); err != nil {
		fail("ledger counts", err)
		return b.String()
	}
	fmt.Fprintf(&b, "ledger: %d rows, %d distinct ids\n", total, distinct)
	var ids [][]byte
	if dupIDs > 0 {
		fmt.Fprintf(&b, "%d ids written more than once (%d extra rows): %d under one claim token, %d under several, %d with a row without a token; "+
			"%d with two rows in one transaction; %d written by more than one consumer, %d by more than one process\n",
			dupIDs, extra, oneToken, twoTokens, noToken, oneTx, members, pids)
		ids = l.explainRows(ctx, &b)
	}
	l.explainRecords(ctx, &b, ids)
	if l.ev == nil {
		return b.String()
	}
	for _, id := range ids {
		lines, more := l.ev.events(string(id), explainEvents)
		if len(lines) == 0 {
			fmt.Fprintf(&b, "events of %s: none\n", id)
			continue
		}
		fmt.Fprintf(&b, "events of %s:\n", id)
		for _, line := range lines {
			fmt.Fprintf(&b, "    %s\n", line)
		}
		if more > 0 {
			fmt.Fprintf(&b, "    (%d more)\n", more)
		}
	}
	l.explainSessions(ctx, &b)
	goroutines(&b)
	counts, recent := l.ev.summary()
	fmt.Fprintf(&b, "guard and consumer events since %s:", l.ev.start.Format("15:04:05.000"))
	if len(counts) == 0 {
		fmt.Fprintf(&b, " none")
	}
	b.WriteString("\n")
	for _, c := range counts {
		fmt.Fprintf(&b, "    %s\n", c)
	}
	if len(recent) > 0 {
		fmt.Fprintf(&b, "last events:\n")
		for _, line := range recent {
			fmt.Fprintf(&b, "    %s\n", line)
		}
	}
	return b.String()
}

// explainRows logs the rows of the first duplicated ids (by their first
// write) and returns those ids.
func (l *Ledger) explainRows(ctx context.Context, b *strings.Builder) [][]byte {
	rows, err := l.Pool.Query(ctx, `WITH d AS (
		SELECT msg_id, min(applied_at) AS first FROM `+l.Table+` GROUP BY msg_id HAVING count(*) > 1 ORDER BY first, msg_id LIMIT $1),
	tx AS (SELECT txid, count(*) AS n FROM `+l.Table+` WHERE txid IN (SELECT l.txid FROM `+l.Table+` l JOIN d USING (msg_id)) GROUP BY txid)
	SELECT l.msg_id, l.token, l.delivery, l.member, l.pid, l.txid, tx.n, l.backend, l.applied_at
	FROM `+l.Table+` l JOIN d USING (msg_id) JOIN tx USING (txid) ORDER BY d.first, l.msg_id, l.applied_at`, explainIDs)
	if err != nil {
		fmt.Fprintf(b, "  (duplicated rows: %v)\n", err)
		return nil
	}
	defer rows.Close()
	var ids [][]byte
	last := ""
	for rows.Next() {
		var (
			id, member    string
			token         *int64
			delivery, pid *int32
			txid, txRows  int64
			backend       int32
			at            time.Time
		)
		if err := rows.Scan(&id, &token, &delivery, &member, &pid, &txid, &txRows, &backend, &at); err != nil {
			fmt.Fprintf(b, "  (duplicated rows: %v)\n", err)
			return ids
		}
		if id != last {
			fmt.Fprintf(b, "%s:\n", id)
			ids = append(ids, []byte(id))
			last = id
		}
		fmt.Fprintf(b, "    %s token %s delivery %s consumer %q pid %s tx %d (%d rows) session %d\n",
			at.Format("15:04:05.000000"), orNull(token), orNull(delivery), member, orNull(pid), txid, txRows, backend)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(b, "  (duplicated rows: %v)\n", err)
	}
	return ids
}

// explainRecords logs the pgstore records of ids and how many records are
// in each state, when the ledger's schema holds a pgstore (OpenPGStore).
func (l *Ledger) explainRecords(ctx context.Context, b *strings.Builder, ids [][]byte) {
	tbl := l.Schema + ".idem_records"
	var exists bool
	if err := l.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tbl).Scan(&exists); err != nil || !exists {
		return
	}
	rows, err := l.Pool.Query(ctx, `SELECT state, count(*), count(*) FILTER (WHERE lease_until < now()) FROM `+tbl+` GROUP BY state ORDER BY state`)
	if err != nil {
		fmt.Fprintf(b, "  (store records: %v)\n", err)
		return
	}
	var parts []string
	for rows.Next() {
		var st int16
		var n, past int
		if err := rows.Scan(&st, &n, &past); err != nil {
			break
		}
		p := fmt.Sprintf("%s %d", idem.State(st), n)
		if idem.State(st) == idem.StateInProgress {
			p += fmt.Sprintf(" (%d past their lease)", past)
		}
		parts = append(parts, p)
	}
	rows.Close()
	fmt.Fprintf(b, "store records: %s\n", strings.Join(parts, ", "))
	if len(ids) == 0 {
		return
	}
	rows, err = l.Pool.Query(ctx, `SELECT key, token, state, attempts, lease_until, updated_at, last_error FROM `+tbl+` WHERE key = ANY($1) ORDER BY key`, ids)
	if err != nil {
		fmt.Fprintf(b, "  (store records: %v)\n", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key        []byte
			token      int64
			st         int16
			attempts   int32
			lease, upd time.Time
			lastErr    string
		)
		if err := rows.Scan(&key, &token, &st, &attempts, &lease, &upd, &lastErr); err != nil {
			fmt.Fprintf(b, "  (store records: %v)\n", err)
			return
		}
		fmt.Fprintf(b, "record %s: %s, token %d, attempts %d, lease until %s, updated %s, last error %q\n",
			key, idem.State(st), token, attempts, lease.Format("15:04:05.000"), upd.Format("15:04:05.000"), lastErr)
	}
}

func orNull[T int64 | int32](p *T) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}

// goroutinesMax bounds the goroutine stacks Explain logs.
const goroutinesMax = 16 << 10

// goroutines writes this process's goroutines that run idem's code (not
// the test's own: this one, the testing package's), grouped by identical
// stack with their number (runtime/pprof's debug=1 form), at most
// goroutinesMax bytes, the largest groups first.
func goroutines(b *strings.Builder) {
	var all bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&all, 1); err != nil {
		fmt.Fprintf(b, "  (goroutines: %v)\n", err)
		return
	}
	type group struct {
		n    int
		text string
	}
	var gs []group
	_, prof, _ := strings.Cut(all.String(), "\n") // after the header line
	for _, g := range strings.Split(prof, "\n\n") {
		var n int
		if _, err := fmt.Sscanf(g, "%d @", &n); err != nil || !strings.Contains(g, "idem-dev/idem/") ||
			strings.Contains(g, "e2etest.goroutines") || strings.Contains(g, "testing.(*M).Run") {
			continue
		}
		gs = append(gs, group{n, g})
	}
	sort.SliceStable(gs, func(i, j int) bool { return gs[i].n > gs[j].n })
	fmt.Fprintf(b, "goroutines in idem's code, by stack (%d stacks):\n", len(gs))
	size := 0
	for i, g := range gs {
		if size+len(g.text) > goroutinesMax {
			fmt.Fprintf(b, "  (%d more stacks)\n", len(gs)-i)
			break
		}
		size += len(g.text)
		b.WriteString(g.text)
		b.WriteString("\n")
	}
}

// explainSessions logs the ledger pool's figures (a pgstore opened by
// OpenPGStore shares it) and the database's sessions by state and wait.
func (l *Ledger) explainSessions(ctx context.Context, b *strings.Builder) {
	st := l.Pool.Stat()
	fmt.Fprintf(b, "ledger pool: %d of %d connections in use, %d idle; %d acquires, %d found no idle connection (%s waiting in all), %d cancelled\n",
		st.AcquiredConns(), st.MaxConns(), st.IdleConns(), st.AcquireCount(), st.EmptyAcquireCount(),
		st.EmptyAcquireWaitTime().Round(time.Millisecond), st.CanceledAcquireCount())
	rows, err := l.Pool.Query(ctx, `SELECT coalesce(state, ''), coalesce(wait_event_type || ':' || wait_event, ''), count(*),
		coalesce(max(now() - xact_start), '0'), coalesce(max(now() - query_start) FILTER (WHERE state = 'active'), '0')
	FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
	GROUP BY 1, 2 ORDER BY 3 DESC`)
	if err != nil {
		fmt.Fprintf(b, "  (database sessions: %v)\n", err)
		return
	}
	defer rows.Close()
	fmt.Fprintf(b, "database sessions (all clients) by state and wait:\n")
	for rows.Next() {
		var state, wait string
		var n int
		var xact, query time.Duration
		if err := rows.Scan(&state, &wait, &n, &xact, &query); err != nil {
			fmt.Fprintf(b, "  (database sessions: %v)\n", err)
			return
		}
		fmt.Fprintf(b, "    %d %s %s (oldest transaction %s, longest active query %s)\n", n, state, wait, xact.Round(time.Millisecond), query.Round(time.Millisecond))
	}
}
