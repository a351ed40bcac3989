package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestClassifyErrorRealReplies classifies errors that go-redis really
// returns from servers the test starts (not hand-made values): a refused
// connection, a read-only replica (READONLY), a replica that may not serve
// stale data (MASTERDOWN), a full server (OOM), a read timeout after the
// write (CLIENT PAUSE), a WRONGTYPE reply, a connection cut after the
// request (the proxy), and redis.Nil.
func TestClassifyErrorRealReplies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := mustNew(t, redisstore.Config{Client: ownClient(t, "127.0.0.1:1"), SkipChecks: true})
	var classifier idem.ErrorClassifier = s

	// A replica of nothing: read-only, and (once set) refusing stale reads.
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", "1")
	if err := ownClient(t, replica.Addr()).ConfigSet(ctx, "replica-serve-stale-data", "no").Err(); err != nil {
		t.Fatal(err)
	}
	full := redistest.StartServer(t, "--maxmemory", "1")
	plain := redistest.StartServer(t)
	proxy := redistest.StartProxy(t, plain.Addr())
	viaProxy := ownClient(t, proxy.Addr())
	direct := ownClient(t, plain.Addr())
	if err := direct.HSet(ctx, "h", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		call func() error
		want error // nil: unchanged
	}{
		{"refused", func() error { return ownClient(t, "127.0.0.1:1").Set(ctx, "k", "v", 0).Err() }, idem.ErrUnavailable},
		{"READONLY", func() error { return ownClient(t, replica.Addr()).Set(ctx, "k", "v", 0).Err() }, idem.ErrUnavailable},
		{"MASTERDOWN", func() error { return ownClient(t, replica.Addr()).Get(ctx, "k").Err() }, idem.ErrUnavailable},
		{"OOM", func() error { return ownClient(t, full.Addr()).Set(ctx, "k", "v", 0).Err() }, idem.ErrCapacity},
		{"WRONGTYPE", func() error { return direct.Get(ctx, "h").Err() }, nil},
		{"nil", func() error { return direct.Get(ctx, "absent").Err() }, nil},
		{"timeout after the write", func() error {
			// The server holds writes for 2 s; the client reads for 100 ms.
			if err := direct.Do(ctx, "CLIENT", "PAUSE", 2000, "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			defer direct.Do(ctx, "CLIENT", "UNPAUSE")
			c := redis.NewClient(&redis.Options{Addr: plain.Addr(), MaxRetries: -1, ReadTimeout: 100 * time.Millisecond})
			defer c.Close()
			return c.Set(ctx, "k", "v", 0).Err()
		}, idem.ErrUnknownOutcome},
		// go-redis reports a connection the server closed as a bare io.EOF,
		// which idem.ClassifyError leaves alone (any reader says EOF at its
		// end): a handler's lost Redis reply is not classified.
		{"reply lost: bare EOF", func() error {
			proxy.CutReply("\r\nincr\r\n")
			return viaProxy.Incr(ctx, "n").Err()
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatal("the call succeeded: nothing to classify")
			}
			got := classifier.ClassifyError(err)
			t.Logf("%T %v -> %v", err, err, got)
			if tc.want == nil {
				if got != err {
					t.Fatalf("ClassifyError(%v) = %v, want it unchanged", err, got)
				}
				return
			}
			if !errors.Is(got, tc.want) || !errors.Is(got, err) {
				t.Fatalf("ClassifyError(%v) = %v, want it to match %v and keep the cause", err, got, tc.want)
			}
			if tc.want == idem.ErrCapacity && !errors.Is(got, idem.ErrUnavailable) {
				t.Fatalf("OOM: %v, want ErrUnavailable too", got)
			}
		})
	}
	if s.ClassifyError(nil) != nil {
		t.Fatal("ClassifyError(nil) != nil")
	}
}
