package rediserr

import (
	"context"
	"errors"
	"io"
	"net"
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
	// A script error is neither: the caller treats it as unknown.
	got := Map(bg, redisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), "op", true)
	if errors.Is(got, idem.ErrUnavailable) || errors.Is(got, idem.ErrUnknownOutcome) {
		t.Fatalf("WRONGTYPE mapped to %v", got)
	}
}
