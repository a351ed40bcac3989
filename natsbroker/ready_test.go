package natsbroker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/brokertest"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var _ broker.Readier = (*natsbroker.Subscriber)(nil)

// TestSubscriberStartsBeforeServer: the application starts while its
// nats-server is down (its connection made with RetryOnFailedConnect).
// NewSubscriber returns a subscriber instead of failing, WaitReady reports
// it not ready, and a Fetch waits. The server starts later on that port,
// and the stream is created only after that (the durable consumer cannot
// exist before its stream): the subscriber creates its durable consumer,
// WaitReady returns nil, and the Fetch that was waiting all along returns
// the message published then. Before, NewSubscriber failed at once.
func TestSubscriberStartsBeforeServer(t *testing.T) {
	port := brokertest.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	conn, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect with RetryOnFailedConnect: %v", err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start, cancelStart := context.WithTimeout(ctx, 2*time.Second)
	sub, err := natsbroker.NewSubscriber(start, natsbroker.SubscriberConfig{JS: js, Stream: "late", Durable: "d", Logger: quietLogger()})
	cancelStart()
	if err != nil {
		t.Fatalf("NewSubscriber with the server down: %v", err)
	}
	defer sub.Close()
	type fetched struct {
		ms  []*broker.Message
		err error
	}
	fc := make(chan fetched, 1)
	go func() {
		ms, err := sub.Fetch(ctx, 10)
		fc <- fetched{ms, err}
	}()
	t.Logf("not ready: %v", brokertest.NotReady(t, sub, 300*time.Millisecond))

	dir := t.TempDir()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
	}()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	for conn.Status() != nats.CONNECTED {
		if ctx.Err() != nil {
			t.Fatal("the connection never reached the late server")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Connected, no stream yet: still not ready, and WaitReady says why
	// once the next try has run.
	for {
		short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
		err = sub.WaitReady(short)
		cancelShort()
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			t.Fatalf("WaitReady without the stream = %v, want the deadline", err)
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			break
		}
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "late", Subjects: []string{"late"}}); err != nil {
		t.Fatal(err)
	}
	if err := sub.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady once the server and the stream exist: %v", err)
	}
	pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, &broker.Message{ID: "m-1", Topic: "late", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-fc:
		if f.err != nil || len(f.ms) != 1 || f.ms[0].ID != "m-1" {
			t.Fatalf("Fetch = %d messages, %v", len(f.ms), f.err)
		}
		if err := f.ms[0].Acker.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the Fetch started before the server never returned")
	}
	brokertest.ReadyThenClosed(t, sub, sub)
}

// quietLogger keeps the subscriber's expected retry warnings out of the
// output unless -v is given.
func quietLogger() *slog.Logger {
	lvl := slog.LevelError
	if testing.Verbose() {
		lvl = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}
