package kafkabroker

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/broker"
)

// TestLag: lag is end offset minus committed offset: everything before
// any commit, still everything while acks are not committed, the rest
// after committing a prefix, zero once all is committed.
func TestLag(t *testing.T) {
	c := newCluster(t)
	adm := admin(t, c)
	topic := createTopic(t, adm, 1)
	p := newPub(t, c)
	cfg := fastSub(c, uniq("g"), topic)
	cfg.CommitInterval = time.Hour // commit only when the test says so
	s := newSub(t, cfg)
	var lr broker.LagReporter = s
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	publish(t, p, msgs(topic, "m", 5)...)
	got := fetchN(t, s, 5, 30*time.Second)
	lag := func() int64 {
		t.Helper()
		n, err := lr.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := lag(); n != 5 {
		t.Fatalf("lag before any commit = %d, want 5", n)
	}
	ackAll(t, got[:3])
	if n := lag(); n != 5 {
		t.Fatalf("lag with acks not committed yet = %d, want 5", n)
	}
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := lag(); n != 2 {
		t.Fatalf("lag after committing offsets 0-2 = %d, want 2", n)
	}
	ackAll(t, got[3:])
	if err := s.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := lag(); n != 0 {
		t.Fatalf("lag with everything committed = %d, want 0", n)
	}
}
