package rediserr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

func TestMap(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	read := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	tests := []struct {
		name  string
		ctx   context.Context
		err   error
		write bool
		want  []error
	}{
		{"nil", bg, nil, true, nil},
		{"refused", bg, dial, true, []error{idem.ErrUnavailable}},
		{"pool timeout", bg, redis.ErrPoolTimeout, true, []error{idem.ErrUnavailable}},
		{"closed client", bg, redis.ErrClosed, true, []error{idem.ErrUnavailable, idem.ErrClosed}},
		{"reset after send", bg, read, true, []error{idem.ErrUnknownOutcome}},
		{"EOF after send", bg, io.EOF, true, []error{idem.ErrUnknownOutcome}},
		{"EOF on a read", bg, io.EOF, false, []error{idem.ErrUnavailable}},
		{"deadline", bg, context.DeadlineExceeded, true, []error{idem.ErrUnknownOutcome, context.DeadlineExceeded}},
		{"cancelled ctx", cancelled, io.ErrUnexpectedEOF, true, []error{idem.ErrUnknownOutcome}},
		{"OOM", bg, redisErr("OOM command not allowed when used memory > 'maxmemory'."), true, []error{idem.ErrUnavailable, idem.ErrCapacity}},
		{"READONLY", bg, redisErr("READONLY You can't write against a read only replica."), true, []error{idem.ErrUnavailable}},
		{"LOADING", bg, redisErr("LOADING Redis is loading the dataset in memory"), true, []error{idem.ErrUnavailable}},
		{"CLUSTERDOWN", bg, redisErr("CLUSTERDOWN The cluster is down"), true, []error{idem.ErrUnavailable}},
		{"BUSY", bg, redisErr("BUSY Redis is busy running a script."), true, []error{idem.ErrUnavailable}},
		{"TRYAGAIN", bg, redisErr("TRYAGAIN Multiple keys request during rehashing of slot"), true, []error{idem.ErrUnavailable}},
		{"MASTERDOWN", bg, redisErr("MASTERDOWN Link with MASTER is down"), true, []error{idem.ErrUnavailable}},
		{"max clients", bg, redisErr("ERR max number of clients reached"), true, []error{idem.ErrUnavailable}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Map(tc.ctx, tc.err, "op", tc.write)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("Map = %v, want nil", got)
				}
				return
			}
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Fatalf("Map = %v, want it to match %v", got, w)
				}
			}
			if !errors.Is(got, tc.err) {
				t.Fatalf("Map = %v lost the cause %v", got, tc.err)
			}
		})
	}
	// A reply the server ran the command to give is neither.
	for _, e := range []error{redisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), redisErr("BUSYKEY Target key name already exists.")} {
		got := Map(bg, e, "op", true)
		if errors.Is(got, idem.ErrUnavailable) || errors.Is(got, idem.ErrUnknownOutcome) {
			t.Fatalf("%v mapped to %v", e, got)
		}
	}
}

func TestClassify(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	dns := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "redis.invalid", IsNotFound: true}}
	dnsTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "redis", IsTimeout: true}}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	pipe := &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	already := fmt.Errorf("%w: x", idem.ErrUnavailable)
	alreadyUnknown := fmt.Errorf("%w: %w", idem.ErrUnknownOutcome, io.EOF)
	plain := errors.New("handler said no")
	unavailable := []error{idem.ErrUnavailable}
	unknown := []error{idem.ErrUnknownOutcome}
	tests := []struct {
		name string
		err  error
		want []error // nil: returned unchanged
	}{
		{"dial refused", dial, unavailable},
		{"dial DNS no such host", dns, nil}, // a configuration error (idem.IsHostNotFound)
		{"dial DNS timeout", dnsTimeout, unavailable},
		{"pool timeout", redis.ErrPoolTimeout, unavailable},
		{"closed client", redis.ErrClosed, []error{idem.ErrUnavailable, idem.ErrClosed}},
		{"bare EOF", io.EOF, nil}, // idem.ClassifyError's rule: any reader says it
		{"unexpected EOF", io.ErrUnexpectedEOF, unknown},
		{"reset after send", reset, unknown},
		{"broken pipe", pipe, unknown},
		{"i/o timeout after write", timeout, unknown},
		{"LOADING", redisErr("LOADING Redis is loading the dataset in memory"), unavailable},
		{"READONLY", redisErr("READONLY You can't write against a read only replica."), unavailable},
		{"CLUSTERDOWN", redisErr("CLUSTERDOWN The cluster is down"), unavailable},
		{"TRYAGAIN", redisErr("TRYAGAIN Multiple keys request during rehashing of slot"), unavailable},
		{"MASTERDOWN", redisErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), unavailable},
		{"MOVED", redisErr("MOVED 3999 127.0.0.1:6381"), unavailable},
		{"ASK", redisErr("ASK 3999 127.0.0.1:6381"), unavailable},
		{"MISCONF", redisErr("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), unavailable},
		{"NOREPLICAS", redisErr("NOREPLICAS Not enough good replicas to write."), unavailable},
		{"BUSY", redisErr("BUSY Redis is busy running a script."), unavailable},
		{"NOAUTH", redisErr("NOAUTH Authentication required."), unavailable},
		{"max clients", redisErr("ERR max number of clients reached"), unavailable},
		{"OOM", redisErr("OOM command not allowed when used memory > 'maxmemory'."), []error{idem.ErrUnavailable, idem.ErrCapacity}},
		{"BUSYKEY", redisErr("BUSYKEY Target key name already exists."), nil},
		{"WRONGTYPE", redisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), nil},
		{"script error", redisErr("ERR user_script:1: Script attempted to access nonexistent global variable 'x'"), nil},
		{"redis.Nil", redis.Nil, nil},
		{"context cancelled", context.Canceled, nil},
		{"deadline", context.DeadlineExceeded, nil},
		{"not a driver error", plain, nil},
		{"already unavailable", already, nil},
		{"already unknown", alreadyUnknown, nil},
	}
	if Classify(nil) != nil {
		t.Fatal("Classify(nil) != nil")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err)
			if tc.want == nil {
				if got != tc.err {
					t.Fatalf("Classify = %v, want it unchanged", got)
				}
				return
			}
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Fatalf("Classify = %v, want it to match %v", got, w)
				}
			}
			if errors.Is(got, idem.ErrUnavailable) && errors.Is(got, idem.ErrUnknownOutcome) {
				t.Fatalf("Classify = %v matches both sentinels", got)
			}
			if !errors.Is(got, tc.err) {
				t.Fatalf("Classify = %v lost the cause %v", got, tc.err)
			}
		})
	}
}
