package rabbitbroker

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitURL is the RabbitMQ the tests use; RABBITMQ_URL overrides it.
// (Exported for the package's external tests, in a _test file.)
func RabbitURL() string {
	if u := os.Getenv("RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// testConn is a connection to the tests' RabbitMQ (RabbitURL), closed
// at cleanup, and its link.
func testConn(t *testing.T) (*amqp.Connection, *link) {
	t.Helper()
	url := RabbitURL()
	c, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("rabbitbroker tests need RabbitMQ at %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c, newLink(c)
}

// testQueue declares a server-named exclusive queue, gone with c.
func testQueue(t *testing.T, c *amqp.Connection) string {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Name
}

// TestPublishEndsWhenReturnsClose: the channel closes after the broker
// confirmed a publish and before publish has drained the returns, so
// amqp091 has closed the returns channel. publish must end (nil: the
// message was confirmed, and a return comes before its confirm, so none
// was missed), not spin on the closed channel while holding the confirm
// channel every other publish waits for. (The Nak(delay) hang of the e2e
// soaks: a delayed copy's publish spinning in its final drain after a
// connection cut, and every other Nak of that connection queued behind
// it for good.)
func TestPublishEndsWhenReturnsClose(t *testing.T) {
	c, l := testConn(t)
	cc, err := newConfirmCh(c, l, "test channel")
	if err != nil {
		t.Fatal(err)
	}
	q := testQueue(t, c)
	closed := make(chan amqp.Return)
	close(closed)
	cc.returns = closed // as amqp091 leaves it when the channel shuts down
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- cc.publish(ctx, []outgoing{{key: q, pub: amqp.Publishing{MessageId: "m", Body: []byte("x")}}})
	}()
	// A hang, not a duration, fails this: publish's own context ends
	// after 20s, and it must have returned by 30s.
	hang, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("publish = %v, want nil (confirmed)", err)
		}
	case <-hang.Done():
		t.Fatal("publish did not return: it spins on the closed returns channel")
	}
}

// TestPublishWaitingForTurn: a publish waiting while another uses the
// channel ends with its own context, or as soon as the link dies, with
// ErrUnavailable (nothing was sent), not when the other one ends.
func TestPublishWaitingForTurn(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(l *link, cancel context.CancelFunc)
		want error
	}{
		{"link dies", func(l *link, _ context.CancelFunc) { l.kill(errors.New("test: connection lost")) }, ErrNotReady},
		{"ctx ends", func(_ *link, cancel context.CancelFunc) { cancel() }, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, l := testConn(t)
			cc, err := newConfirmCh(c, l, "test channel")
			if err != nil {
				t.Fatal(err)
			}
			q := testQueue(t, c)
			cc.turn <- struct{}{} // another publish is using the channel, for good
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- cc.publish(ctx, []outgoing{{key: q, pub: amqp.Publishing{MessageId: "m"}}})
			}()
			tc.end(l, cancel)
			hang, stop := context.WithTimeout(context.Background(), 30*time.Second)
			defer stop()
			select {
			case err := <-done:
				if !errors.Is(err, idem.ErrUnavailable) || !errors.Is(err, tc.want) {
					t.Fatalf("publish = %v, want ErrUnavailable and %v", err, tc.want)
				}
			case <-hang.Done():
				t.Fatal("publish still waits for its turn")
			}
		})
	}
}
