package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// closedPortDialError dials a loopback port nobody listens on.
func closedPortDialError(t *testing.T) error {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("dial %s succeeded after its listener closed", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial of a closed port: %v, want ECONNREFUSED", err)
	}
	return err
}

// resetConnError sends a request to a server that resets the connection
// (SO_LINGER 0) before answering, and returns what the client reads.
func resetConnError(t *testing.T) error {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		c, err := l.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 16)
		io.ReadFull(c, buf[:4]) // the request arrived
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("PING")); err != nil {
		t.Fatal(err)
	}
	<-accepted
	_, err = c.Read(make([]byte, 16))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after reset: %v, want ECONNRESET", err)
	}
	return err
}

// readTimeoutError reads from an established connection past its deadline.
func readTimeoutError(t *testing.T) error {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		c, err := l.Accept()
		if err == nil {
			<-done
			c.Close()
		}
	}()
	defer close(done)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(-time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past deadline: %v", err)
	}
	return err
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassifyError(t *testing.T) {
	appErr := errors.New("insufficient funds")
	already := fmt.Errorf("pgstore: %w", idem.ErrUnknownOutcome)
	for _, tc := range []struct {
		name string
		err  error
		want error // nil: returned unchanged
	}{
		{"dial to a closed port (ECONNREFUSED)", closedPortDialError(t), idem.ErrUnavailable},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, idem.ErrUnavailable},
		// A name that does not exist is a configuration error, not an
		// outage: holding the message for it would hold it for ever.
		{"no such host", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "db.invalid", IsNotFound: true}}, nil},
		{"no such host, bare", &net.DNSError{Err: "no such host", Name: "db.invalid", IsNotFound: true}, nil},
		{"name lookup timeout", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "db", IsTimeout: true}}, idem.ErrUnavailable},
		{"name server failure", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "server misbehaving", Name: "db", IsTemporary: true}}, idem.ErrUnavailable},
		{"name lookup timeout, bare", &net.DNSError{Err: "i/o timeout", Name: "db", IsTimeout: true}, idem.ErrUnavailable},
		{"host unreachable", fmt.Errorf("driver: %w", syscall.EHOSTUNREACH), idem.ErrUnavailable},
		{"connection reset after the request", resetConnError(t), idem.ErrUnknownOutcome},
		{"broken pipe", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, idem.ErrUnknownOutcome},
		{"ETIMEDOUT", fmt.Errorf("read: %w", syscall.ETIMEDOUT), idem.ErrUnknownOutcome},
		{"read past the deadline", readTimeoutError(t), idem.ErrUnknownOutcome},
		{"unexpected EOF mid-reply", fmt.Errorf("pgconn: %w", io.ErrUnexpectedEOF), idem.ErrUnknownOutcome},
		{"use of a closed connection", fmt.Errorf("driver: %w", net.ErrClosed), idem.ErrUnknownOutcome},
		{"already unknown", already, nil},
		{"already unavailable", idem.ErrUnavailable, nil},
		{"application error", appErr, nil},
		{"bare EOF", io.EOF, nil},
		{"caller cancelled", context.Canceled, nil},
		{"caller's deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := idem.ClassifyError(tc.err)
			if tc.want == nil {
				if got != tc.err {
					t.Fatalf("ClassifyError(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			}
			if !errors.Is(got, tc.want) || !errors.Is(got, tc.err) {
				t.Fatalf("ClassifyError(%v) = %v, want %v wrapping the original", tc.err, got, tc.want)
			}
			other := idem.ErrUnknownOutcome
			if tc.want == idem.ErrUnknownOutcome {
				other = idem.ErrUnavailable
			}
			if errors.Is(got, other) {
				t.Fatalf("ClassifyError(%v) = %v matches %v too", tc.err, got, other)
			}
		})
	}
	if idem.ClassifyError(nil) != nil {
		t.Fatal("nil did not stay nil")
	}
}
