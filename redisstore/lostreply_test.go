package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// scriptsSent counts the script commands (EVALSHA and EVAL) that went
// through the proxies.
func scriptsSent(ps ...*redistest.Proxy) int {
	n := 0
	for _, p := range ps {
		n += p.Count("\r\nevalsha\r\n") + p.Count("\r\neval\r\n")
	}
	return n
}

// TestLostClaimReplyIsUnknownOutcome puts a TCP proxy between go-redis,
// with its default options, and a Redis server, and loses the reply of a
// claim script after Redis ran it. The claim must return ErrUnknownOutcome
// with the script sent exactly once, and the key must show one attempt.
// Before the fix go-redis re-sent the script on a new connection
// (MaxRetries 3 by default; on a cluster also its MaxRedirects loop, even
// with MaxRetries -1): the caller was told its own key was in progress,
// or, with a lease already over, took it over again with Attempts 2.
func TestLostClaimReplyIsUnknownOutcome(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := redistest.StartProxy(t, srv.Addr())
	direct := ownClient(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// 1 ms leases: a hidden retry (10 ms or more later) would take the key
	// over and count a second attempt.
	req := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: []byte(k), Lease: time.Millisecond, TTL: time.Hour}
	}
	// checkOnce checks a call whose reply was cut: want script commands
	// sent since before, ErrUnknownOutcome, and keys claimed once.
	checkOnce := func(t *testing.T, err error, before, want int, keys ...string) {
		t.Helper()
		if proxy.Armed() {
			t.Fatal("the cut did not happen: the test proves nothing")
		}
		if n := scriptsSent(proxy) - before; n != want {
			t.Fatalf("%d script commands sent, want %d (a hidden retry); the call returned %v", n, want, err)
		}
		if !errors.Is(err, idem.ErrUnknownOutcome) {
			t.Fatalf("claim whose reply was lost: %v, want ErrUnknownOutcome", err)
		}
		check := mustNew(t, redisstore.Config{Client: direct, SkipChecks: true})
		for _, k := range keys {
			rec, err := check.Get(ctx, []byte(k))
			if err != nil {
				t.Fatalf("%s: the script ran but %v", k, err)
			}
			if rec.Attempts != 1 {
				t.Fatalf("%s: Attempts %d, want 1 (the claim ran more than once)", k, rec.Attempts)
			}
		}
	}
	newStore := func(t *testing.T, cfg redisstore.Config) *redisstore.Store {
		c := redis.NewClient(&redis.Options{Addr: proxy.Addr()}) // go-redis defaults
		t.Cleanup(func() { c.Close() })
		cfg.Client, cfg.SkipChecks = c, true
		s := mustNew(t, cfg)
		if _, err := s.Claim(ctx, req("warm-"+t.Name())); err != nil { // loads the script
			t.Fatal(err)
		}
		return s
	}
	t.Run("Claim", func(t *testing.T) {
		s := newStore(t, redisstore.Config{})
		before := scriptsSent(proxy)
		proxy.CutReply("\r\nevalsha\r\n")
		_, err := s.Claim(ctx, req("a"))
		checkOnce(t, err, before, 1, "a")
	})
	t.Run("ClaimNoCoalesce", func(t *testing.T) {
		s := newStore(t, redisstore.Config{NoCoalesce: true})
		before := scriptsSent(proxy)
		proxy.CutReply("\r\nevalsha\r\n")
		_, err := s.Claim(ctx, req("b"))
		checkOnce(t, err, before, 1, "b")
	})
	t.Run("ClaimBatchPipelined", func(t *testing.T) {
		s := newStore(t, redisstore.Config{BatchChunk: 1})
		before := scriptsSent(proxy)
		proxy.CutReply("\r\nevalsha\r\n")
		_, err := s.ClaimBatch(ctx, []idem.ClaimRequest{req("c1"), req("c2")})
		checkOnce(t, err, before, 2, "c1", "c2") // two chunks, one pipeline
	})
	t.Run("EvalAfterNoScript", func(t *testing.T) {
		s := newStore(t, redisstore.Config{NoCoalesce: true})
		if err := direct.ScriptFlush(ctx).Err(); err != nil { // our own server
			t.Fatal(err)
		}
		before := scriptsSent(proxy)
		proxy.CutReply("\r\neval\r\n") // the EVAL that follows NOSCRIPT
		_, err := s.Claim(ctx, req("d"))
		// EVALSHA (NOSCRIPT, nothing ran), then EVAL, once.
		checkOnce(t, err, before, 2, "d")
	})
}

// TestLostClaimReplyIsUnknownOutcomeCluster: the same on a 3-master
// cluster, where go-redis's ClusterClient re-sends a command after a
// network error in its MaxRedirects loop even with MaxRetries -1.
func TestLostClaimReplyIsUnknownOutcomeCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	proxies := map[string]*redistest.Proxy{}
	var all []*redistest.Proxy
	for _, a := range cl.Addrs() {
		p := redistest.StartProxy(t, a)
		proxies[a] = p
		all = append(all, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { direct.Close() })
	for _, tc := range []struct {
		name       string
		maxRetries int
		noCoalesce bool
	}{{"defaults", 0, false}, {"MaxRetries-1", -1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: tc.maxRetries,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					var d net.Dialer
					if p := proxies[addr]; p != nil {
						addr = p.Addr()
					}
					return d.DialContext(ctx, network, addr)
				}})
			t.Cleanup(func() { c.Close() })
			s := mustNew(t, redisstore.Config{Client: c, SkipChecks: true, NoCoalesce: tc.noCoalesce})
			key := "k-" + tc.name
			req := idem.ClaimRequest{Key: []byte(key), Lease: time.Millisecond, TTL: time.Hour}
			// 64 keys reach every master: each has the script afterwards,
			// so the claim below is one EVALSHA.
			var warm []idem.ClaimRequest
			for i := range 64 {
				warm = append(warm, idem.ClaimRequest{Key: []byte(tc.name + "-warm-" + strconv.Itoa(i)), Lease: time.Minute, TTL: time.Hour})
			}
			if _, err := s.ClaimBatch(ctx, warm); err != nil {
				t.Fatal(err)
			}
			m, err := c.MasterForKey(ctx, s.RecordKey([]byte(key)))
			if err != nil {
				t.Fatal(err)
			}
			p := proxies[m.Options().Addr]
			if p == nil {
				t.Fatalf("no proxy for %s", m.Options().Addr)
			}
			before := scriptsSent(all...)
			p.CutReply("\r\nevalsha\r\n")
			_, err = s.Claim(ctx, req)
			if p.Armed() {
				t.Fatal("the cut did not happen: the test proves nothing")
			}
			if n := scriptsSent(all...) - before; n != 1 {
				t.Fatalf("%d script commands sent for one claim, want 1 (a hidden retry); Claim returned %v", n, err)
			}
			if !errors.Is(err, idem.ErrUnknownOutcome) {
				t.Fatalf("claim whose reply was lost: %v, want ErrUnknownOutcome", err)
			}
			chk := mustNew(t, redisstore.Config{Client: direct, SkipChecks: true})
			rec, err := chk.Get(ctx, []byte(key))
			if err != nil || rec.Attempts != 1 {
				t.Fatalf("%s: %+v %v, want one attempt", key, rec, err)
			}
		})
	}
}
