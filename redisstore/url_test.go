package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/idem-dev/idem/storetest"
)

func TestFromURL(t *testing.T) {
	c, err := redisstore.FromURL("rediss://u:secret@cache.example:6380/3?dial_timeout=2s&pool_size=7&client_name=x" +
		"&namespace=n1&prefix=app:&shards=64&wait_replicas=1&wait_timeout=250ms&batch_chunk=32&coalesce_in_flight=8&no_coalesce=true&skip_checks=1")
	if err != nil {
		t.Fatal(err)
	}
	o, s := c.Client, c.Store
	if c.Cluster != nil || o.Addr != "cache.example:6380" || o.DB != 3 || o.Username != "u" || o.Password != "secret" || o.TLSConfig == nil ||
		o.DialTimeout != 2*time.Second || o.PoolSize != 7 || o.ClientName != "x" {
		t.Fatalf("client options %+v", o)
	}
	if s.Namespace != "n1" || s.Prefix != "app:" || s.Shards != 64 || s.WaitReplicas != 1 || s.WaitTimeout != 250*time.Millisecond ||
		s.BatchChunk != 32 || s.CoalesceInFlight != 8 || !s.NoCoalesce || !s.SkipChecks {
		t.Fatalf("store config %+v", s)
	}
	c, err = redisstore.FromURL("redis+cluster://:pw@10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000&max_redirects=2&namespace=n2")
	if err != nil {
		t.Fatal(err)
	}
	if c.Client != nil || len(c.Cluster.Addrs) != 3 || c.Cluster.Addrs[2] != "10.0.0.3:7000" || c.Cluster.Password != "pw" ||
		c.Cluster.MaxRedirects != 2 || c.Cluster.TLSConfig != nil || c.Store.Namespace != "n2" {
		t.Fatalf("cluster %+v %+v", c.Cluster, c.Store)
	}
	if c, err = redisstore.FromURL("rediss+cluster://h:7000"); err != nil || c.Cluster.TLSConfig == nil {
		t.Fatalf("rediss+cluster: %+v %v", c, err)
	}
	if c, err = redisstore.FromURL("unix:///run/redis.sock?db=2"); err != nil || c.Client.Network != "unix" || c.Client.DB != 2 {
		t.Fatalf("unix: %+v %v", c, err)
	}
	for _, tc := range []struct{ url, err string }{
		{"postgres://h/db", `scheme "postgres"`},
		{"redis://h/x", "invalid database"},
		{"redis://h?pool_size=many", "pool_size"},
		{"redis://h?bogus=1", "unexpected option: bogus"},
		{"redis://h?shards=0", "shards"},
		{"redis://h?prefix=a{b}", "Prefix"},
		{"redis://h?wait_timeout=-1s", "negative"},
		{"redis://h?no_coalesce=perhaps", "no_coalesce"},
		{"redis+cluster://h?db=1", "db"},
		{"redis://:hunter2@h:x", "bad URL"},
	} {
		_, err := redisstore.FromURL(tc.url)
		if err == nil || !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("FromURL(%q) = %v; want ErrInvalidArgument containing %q", tc.url, err, tc.err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("FromURL(%q): the error shows the password: %v", tc.url, err)
		}
	}
}

// TestFromURLOpen opens a store from a URL on the test server, claims a key
// and closes the client with the Store; a closed port is ErrUnavailable.
func TestFromURLOpen(t *testing.T) {
	ctx := context.Background()
	ns := storetest.NewNamespace()
	// Delete keeps the namespace's token counter (idem:<ns>:seq): drop all
	// of the namespace's keys, even when the test fails half way.
	rc := sharedClient(t)
	t.Cleanup(func() { redistest.DropPrefix(t, rc, "idem:"+ns+":") })
	c, err := redisstore.FromURL("redis://127.0.0.1:6379?namespace=" + ns)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cl, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), Lease: time.Second, TTL: time.Second}); err != nil || cl.Outcome != idem.OutcomeAcquired {
		t.Fatalf("claim: %v %v", cl.Outcome, err)
	}
	if err := s.Delete(ctx, []byte("k")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	c, err = redisstore.FromURL("redis://127.0.0.1:1?dial_timeout=1s&max_retries=-1&skip_checks=true")
	if err != nil {
		t.Fatal(err)
	}
	s, err = c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("Ping on a closed port: %v", err)
	}
}
