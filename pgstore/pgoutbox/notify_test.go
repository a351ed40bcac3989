package pgoutbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outboxtest"
	"github.com/idem-dev/idem/pgstore/pgoutbox"
	"github.com/jackc/pgx/v5"
)

// enqueueCommit runs one business transaction enqueuing one message.
func enqueueCommit(t *testing.T, ob *pgoutbox.Outbox, cfg pgoutbox.Config) string {
	t.Helper()
	var ids []string
	err := pgx.BeginFunc(ctxT(t), cfg.Pool, func(tx pgx.Tx) error {
		var err error
		ids, err = ob.Enqueue(ctxT(t), tx, outbox.Message{Topic: "t", Payload: []byte("x")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ob.Notify()
	return ids[0]
}

// TestNotifyWakesRelay: a relay that would look again only in an hour
// publishes messages committed after it went idle: the NOTIFY sent in the
// enqueuing transaction (or by Notify after its commit) woke it. Then the
// listening connection is terminated by the server; the relay reconnects
// and is woken again.
func TestNotifyWakesRelay(t *testing.T) {
	for _, mode := range []pgoutbox.NotifyMode{pgoutbox.NotifyInTx, pgoutbox.NotifyAfterCommit} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) { testNotifyWakesRelay(t, mode) })
	}
}

func testNotifyWakesRelay(t *testing.T, mode pgoutbox.NotifyMode) {
	ob, cfg := newOutbox(t, func(c *pgoutbox.Config) { c.Notify = mode })
	rec := outboxtest.NewRecorder()
	relay, err := outbox.New(outbox.Config{Backend: ob, Publisher: rec, PollInterval: time.Hour, Logger: outboxtest.Quiet()})
	if err != nil {
		t.Fatal(err)
	}
	stop := outboxtest.StartRelay(t, relay)
	defer stop()
	waitListening(t, cfg, 1)
	for i := range 3 {
		id := enqueueCommit(t, ob, cfg)
		outboxtest.WaitFor(t, fmt.Sprintf("message %d published after a notification", i), 60*time.Second,
			func() (bool, string) { return rec.Count(id) == 1, "" })
	}
	// Kill the LISTEN connection: Listen reconnects (and looks once).
	var killed int
	if err := cfg.Pool.QueryRow(ctxT(t), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE query = $1 AND pid <> pg_backend_pid()`, "LISTEN "+pgx.Identifier{cfg.Schema + "." + cfg.Table}.Sanitize()).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listeners, %v; want 1", killed, err)
	}
	waitListening(t, cfg, 1)
	id := enqueueCommit(t, ob, cfg)
	outboxtest.WaitFor(t, "a message published after the listener reconnected", 60*time.Second,
		func() (bool, string) { return rec.Count(id) == 1, "" })
}

// waitListening waits until n sessions are listening on cfg's channel.
func waitListening(t *testing.T, cfg pgoutbox.Config, n int) {
	t.Helper()
	q := "LISTEN " + pgx.Identifier{cfg.Schema + "." + cfg.Table}.Sanitize()
	outboxtest.WaitFor(t, "a LISTEN session", 60*time.Second, func() (bool, string) {
		var got int
		err := cfg.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'idle'`, q).Scan(&got)
		return err == nil && got == n, fmt.Sprintf("%d listening, %v", got, err)
	})
}
