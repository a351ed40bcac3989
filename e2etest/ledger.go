package e2etest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PGURL is the PostgreSQL the ledger lives in; IDEM_PG_URL overrides it.
func PGURL() string {
	if u := os.Getenv("IDEM_PG_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Ledger is the table every effect appends a row to. It has no unique
// constraint on purpose: a double effect must show as two rows, not be
// hidden by the database.
type Ledger struct {
	Pool   *pgxpool.Pool
	Schema string // unique to the test; other tables (a pgstore) may live here too
	Table  string // schema-qualified: Schema + ".ledger"

	created time.Time
	ev      *evidence    // the test's evidence; nil in a child process
	members atomic.Int64 // consumers named by ConsumerConfig
}

var seq atomic.Int64

// ledgerDDL is the ledger table. Besides the message, each row says who
// wrote it, so that a duplicate explains itself (Explain): the claim's
// fencing token (NULL where the handler had none: fail-open, or an effect
// not run by the runtime), the broker's delivery count, the consumer
// (ConsumerConfig's c1, c2...; empty otherwise), the process, the
// PostgreSQL transaction and session, and the time of the write.
const ledgerDDL = `(msg_id text NOT NULL, payload bytea,
	token bigint, delivery int, member text NOT NULL DEFAULT '', pid int,
	txid bigint NOT NULL DEFAULT txid_current(), backend int NOT NULL DEFAULT pg_backend_pid(),
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`

// ledgerColumns are the columns an effect writes (see row).
var ledgerColumns = []string{"msg_id", "payload", "token", "delivery", "member", "pid"}

// NewLedger makes a schema named prefix_<unique> holding the ledger table
// and drops it (CASCADE) at cleanup. It fails the test when PostgreSQL is
// unreachable. If the test fails, its cleanup first logs what explains
// the failure (Explain).
func NewLedger(t testing.TB, prefix string) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(PGURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("postgres at %s: %v", PGURL(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("postgres at %s: %v", PGURL(), err)
	}
	schema := fmt.Sprintf("%s_%d_%d_%d", prefix, os.Getpid(), time.Now().UnixNano()%1e9, seq.Add(1))
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.ledger `+ledgerDDL); err != nil {
		pool.Close()
		t.Fatal(err)
	}
	var ev *evidence
	if _, bench := t.(*testing.B); !bench {
		ev = evidenceFor(t)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		pool.Close()
	})
	l := &Ledger{Pool: pool, Schema: schema, Table: schema + ".ledger", created: time.Now(), ev: ev}
	t.Cleanup(func() { // before the drop
		if t.Failed() {
			l.Explain(t)
		}
	})
	return l
}

type memberKey struct{}

// WithMember names the consumer whose effects run with ctx: the ledger
// rows they write carry it (ConsumerConfig does this for its handlers).
func WithMember(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, memberKey{}, name)
}

var pid = os.Getpid()

// row is m's ledger row: its id and payload, and who writes it.
func row(ctx context.Context, m *broker.Message) []any {
	var token any // NULL: no claim token in ctx
	if tk, ok := consumer.MessageToken(ctx, m); ok {
		token = int64(tk)
	}
	member, _ := ctx.Value(memberKey{}).(string)
	return []any{m.ID, m.Payload, token, m.Delivery, member, pid}
}

// Insert is the single-message effect: one autocommitted INSERT.
func (l *Ledger) Insert() consumer.Handler {
	q := `INSERT INTO ` + l.Table + ` (` + strings.Join(ledgerColumns, ", ") + `) VALUES ($1, $2, $3, $4, $5, $6)`
	return func(ctx context.Context, m *broker.Message) ([]byte, error) {
		_, err := l.Pool.Exec(ctx, q, row(ctx, m)...)
		return nil, err
	}
}

// InsertBatch is the batch effect: one transaction with a COPY of every
// message, synchronous commit; all or nothing.
func (l *Ledger) InsertBatch() consumer.BatchHandler {
	return func(ctx context.Context, msgs []*broker.Message) error {
		return pgx.BeginFunc(ctx, l.Pool, func(tx pgx.Tx) error { return l.Copy(ctx, tx, msgs) })
	}
}

// Copy appends msgs to the ledger inside tx, for effects that share a
// transaction with other work (claims and completions).
func (l *Ledger) Copy(ctx context.Context, tx pgx.Tx, msgs []*broker.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	rows := make([][]any, len(msgs))
	for i, m := range msgs {
		rows[i] = row(ctx, m)
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{l.Schema, "ledger"}, ledgerColumns, pgx.CopyFromRows(rows))
	return err
}

// Counts returns the number of rows and of distinct ids.
func (l *Ledger) Counts(t testing.TB) (total, distinct int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM `+l.Table).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	return total, distinct
}

// WaitDistinct polls until the ledger holds at least want distinct ids
// (logging when, counted from the ledger's creation), failing the test
// after 5 minutes.
func (l *Ledger) WaitDistinct(t testing.TB, what string, want int) {
	t.Helper()
	var total, distinct int
	WaitFor(t, what, 5*time.Minute, func() (bool, string) {
		total, distinct = l.Counts(t)
		return distinct >= want, fmt.Sprintf("%d rows, %d distinct", total, distinct)
	})
	t.Logf("%s: %d rows, %d distinct at %s", what, total, distinct, time.Since(l.created).Round(time.Millisecond))
}

// Missing returns up to limit indexes in [0, n) whose message is not in the
// ledger yet.
func (l *Ledger) Missing(t testing.TB, n, limit int) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := l.Pool.Query(ctx, `SELECT i FROM generate_series(0, $1::int - 1) i
		WHERE NOT EXISTS (SELECT 1 FROM `+l.Table+` l WHERE l.msg_id = 'msg-' || lpad(i::text, 7, '0')) LIMIT $2`, n, limit)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int, len(idx))
	for i, v := range idx {
		out[i] = int(v)
	}
	return out
}

// AssertExactlyOnce fails the test unless the ledger holds the messages
// 0..n-1 (as made by Message) exactly once each, each with its own payload.
func (l *Ledger) AssertExactlyOnce(t testing.TB, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.CheckExactlyOnce(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// CheckExactlyOnce is AssertExactlyOnce returning what is wrong instead.
func (l *Ledger) CheckExactlyOnce(ctx context.Context, n int) error {
	var problems []string
	var total, distinct int
	if err := l.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM `+l.Table).Scan(&total, &distinct); err != nil {
		return err
	}
	if total != n || distinct != n {
		p := fmt.Sprintf("ledger has %d rows for %d distinct ids, want %d each once", total, distinct, n)
		var id string
		var cnt int
		err := l.Pool.QueryRow(ctx, `SELECT msg_id, count(*) FROM `+l.Table+` GROUP BY msg_id HAVING count(*) > 1 ORDER BY msg_id LIMIT 1`).Scan(&id, &cnt)
		if err == nil {
			p += fmt.Sprintf(" (e.g. %s x%d)", id, cnt)
		}
		problems = append(problems, p)
	}
	var missing, foreign, wrong int
	if err := l.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM generate_series(0, $1::int - 1) i
			WHERE NOT EXISTS (SELECT 1 FROM `+l.Table+` l WHERE l.msg_id = 'msg-' || lpad(i::text, 7, '0'))),
		(SELECT count(*) FROM `+l.Table+` WHERE CASE WHEN msg_id ~ '^msg-[0-9]{7}$' THEN substr(msg_id, 5)::int >= $1 ELSE true END),
		(SELECT count(*) FROM `+l.Table+` WHERE CASE WHEN msg_id ~ '^msg-[0-9]{7}$'
			THEN payload IS DISTINCT FROM convert_to('{"n":' || substr(msg_id, 5)::int || '}', 'UTF8') ELSE false END)`, n).Scan(&missing, &foreign, &wrong); err != nil {
		return err
	}
	if missing > 0 {
		problems = append(problems, fmt.Sprintf("%d of the %d ids are missing", missing, n))
	}
	if foreign > 0 {
		problems = append(problems, fmt.Sprintf("%d rows carry an id that was never published", foreign))
	}
	if wrong > 0 {
		problems = append(problems, fmt.Sprintf("%d rows carry another message's payload", wrong))
	}
	if len(problems) > 0 {
		return fmt.Errorf("not exactly once: %s", strings.Join(problems, "; "))
	}
	return nil
}

// OpenLedger connects to the ledger in schema, made by another process's
// NewLedger (which drops it); the pool is closed at cleanup.
func OpenLedger(t testing.TB, schema string) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, PGURL())
	if err != nil {
		t.Fatalf("postgres at %s: %v", PGURL(), err)
	}
	t.Cleanup(pool.Close)
	return &Ledger{Pool: pool, Schema: schema, Table: schema + ".ledger", created: time.Now()}
}
