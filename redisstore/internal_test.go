package redisstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/redis/go-redis/v9"
)

func TestConfigValidate(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Client: c}, true},
		{"cluster", Config{Client: cc, Namespace: "a.b_c-1"}, true},
		{"no client", Config{}, false},
		{"bad namespace", Config{Client: c, Namespace: "a:b"}, false},
		{"brace in prefix", Config{Client: c, Prefix: "x{"}, false},
		{"too many shards", Config{Client: c, Shards: MaxShards + 1}, false},
		{"negative shards", Config{Client: c, Shards: -1}, false},
		{"negative wait", Config{Client: c, WaitReplicas: -1}, false},
		{"wait on cluster", Config{Client: cc, WaitReplicas: 1}, true},
		{"wait on single", Config{Client: c, WaitReplicas: 1}, true},
		{"chunk too big", Config{Client: c, BatchChunk: 5000}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("Validate = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

// TestKeyLayout pins the documented key layout (docs/redisstore.md): a
// change here hides every record written by an earlier version.
func TestKeyLayout(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	s, err := New(context.Background(), Config{Client: c, Namespace: "orders", SkipChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	rk, sk := s.keysOf([]byte("order-42"))
	if rk != "idem:orders:{756}:k:order-42" || sk != "idem:orders:seq" {
		t.Fatalf("keys %q %q", rk, sk)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	cs, err := New(context.Background(), Config{Client: cc, Namespace: "orders", SkipChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	if rk, sk := cs.keysOf([]byte("order-42")); rk != "idem:orders:{756}:k:order-42" || sk != "idem:orders:{756}:seq" {
		t.Fatalf("cluster keys %q %q", rk, sk)
	}
	for _, k := range [][]byte{[]byte("a}:k:b"), {0, 0xff, '{', '}'}, []byte("*?[")} {
		rk, _ := s.keysOf(k)
		got, ok := s.userKey(rk)
		if !ok || string(got) != string(k) {
			t.Fatalf("userKey(%q) = %q %v", rk, got, ok)
		}
	}
	if p := s.matchPattern(); p != "idem:orders:{*}:k:*" {
		t.Fatalf("pattern %q", p)
	}
	s2, _ := s.Namespace("x")
	if p := func() string { s2.base = "a*b?[c]:{"; return s2.matchPattern() }(); !strings.HasPrefix(p, `a\*b\?\[c\]:{`) {
		t.Fatalf("escaped pattern %q", p)
	}
}

// TestClosedAndInvalid needs no server: closed stores and bad arguments
// fail before any I/O.
func TestClosedAndInvalid(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	s, _ := New(context.Background(), Config{Client: c, SkipChecks: true})
	ctx := context.Background()
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: nil, Lease: time.Second, TTL: time.Second}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	s.Close()
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("k"), Lease: time.Second, TTL: time.Second}); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("Claim after Close: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
}

func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{"", "0-0-", "2-12345-6162", "1-0-zz", "-1-0-", "a-b-c", "0-18446744073709551615-00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := parseCursor(s)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("error %v does not match ErrInvalidArgument", err)
			}
			return
		}
		if s == "" {
			return
		}
		c2, err := parseCursor(c.String())
		if err != nil || c2 != c {
			t.Fatalf("round trip %q -> %+v -> %q -> %+v %v", s, c, c.String(), c2, err)
		}
	})
}

// FuzzParseRecord feeds arbitrary values to the record decoder: it must
// never panic, and what it accepts must be self-consistent.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{
		"2|p|1764450000000123|1|1764450000000|60000|1764450000000|3600000|1764450000000|1764450000000|3600000|0|0|",
		"2|c|1764450000000200|2|1764450000000|60000|1764450001000|3600000|1764450000000|1764450001000|3600000|4|3|fp-aerrresult\x00\xff",
		"2|r|5|1|1|1|1|1|1|1|1|0|5|cause",
		"3|p|1764450000000123|1|1764450000000|1764450000000|1764450000000|1764450000000|60000|3600000|3600000|0|0|",
		"3|c|1764450000000200|2|1764450000000|1764450001000|1764450000000|1764450001000|60000|3600000|3600000|4|3|fp-aerrresult\x00\xff",
		"4|p|1|1|1|1|1|1|1|1|1|0|0|",
		"1|p|1|1|1|1|1|1|1|0|0|",
		"2|p|1|1|1|1|1|1|1|1|1|9|9|short",
		"2|x|1|1|1|1|1|1|1|1|1|0|0|",
		"2|p|-1|1|1|1|1|1|1|1|1|0|0|",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, err := parseRecord([]byte("k"), v)
		if err != nil {
			return
		}
		if r.State < idem.StateInProgress || r.State > idem.StateReleased {
			t.Fatalf("accepted state %v from %q", r.State, v)
		}
		if len(r.Fingerprint)+len(r.LastError)+len(r.Result) > len(v) {
			t.Fatalf("fields longer than the value %q", v)
		}
	})
}

// TestRecordVersions pins both record formats to the same Record: version
// 2 records written by earlier builds stay readable after an upgrade.
func TestRecordVersions(t *testing.T) {
	for _, tc := range []struct{ name, v2, v3 string }{
		{"in progress",
			"2|p|1764450000000123|1|1764450000000|60000|1764450000000|3600000|1764450000000|1764450000000|3600000|0|0|",
			"3|p|1764450000000123|1|1764450000000|1764450000000|1764450000000|1764450000000|60000|3600000|3600000|0|0|"},
		{"completed with fingerprint, error and result",
			"2|c|1764450000000200|2|1764450000000|60000|1764450001000|7200000|1764449000000|1764450001000|3600000|4|3|fp-aerrresult\x00\xff",
			"3|c|1764450000000200|2|1764450000000|1764450001000|1764449000000|1764450001000|60000|7200000|3600000|4|3|fp-aerrresult\x00\xff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := parseRecord([]byte("k"), tc.v2)
			if err != nil {
				t.Fatal(err)
			}
			b, err := parseRecord([]byte("k"), tc.v3)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("v2 %+v\nv3 %+v", a, b)
			}
		})
	}
}

// TestFreshRecord checks that the record the client builds for a key the
// claim script acquired fresh is the one parseRecord reads from what the
// script wrote (its prefix plus claimArgs' tail).
func TestFreshRecord(t *testing.T) {
	for _, req := range []idem.ClaimRequest{
		{Key: []byte("a"), Lease: time.Minute, TTL: time.Hour},
		{Key: []byte("b"), Lease: 2 * time.Hour, TTL: time.Hour, Fingerprint: []byte("f|p\x00")},
		{Key: []byte("c"), Lease: 1500 * time.Millisecond, TTL: 0},
	} {
		const tok, now = 1764450000000123, 1764450000000
		args := claimArgs(nil, req)
		tail, px := string(args[0].([]byte)), args[1].(int64)
		ns := strconv.FormatInt(now, 10)
		v := "3|p|" + strconv.FormatUint(tok, 10) + "|1|" + ns + "|" + ns + "|" + ns + "|" + ns + "|" + tail
		want, err := parseRecord(req.Key, v)
		if err != nil {
			t.Fatal(err)
		}
		if got := freshRecord(req, tok, now); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\nfresh  %+v\nparsed %+v", req.Key, got, want)
		}
		if want.ExpiresAt.UnixMilli()-now != px {
			t.Fatalf("%q: px %d, record expires after %d", req.Key, px, want.ExpiresAt.UnixMilli()-now)
		}
	}
}

func TestVersionOK(t *testing.T) {
	for info, want := range map[string]bool{
		"# Server\r\nredis_version:7.0.15\r\n": true,
		"redis_version:7.0.0\r\n":              true,
		"redis_version:6.2.14\r\n":             false,
		"redis_version:6.0.16\r\n":             false,
		"redis_version:5.0.7\r\n":              false,
		"redis_version:10.1.0\r\n":             true,
		"no version here":                      true,
	} {
		if got := versionOK(info); got != want {
			t.Errorf("versionOK(%q) = %v, want %v", info, got, want)
		}
	}
}

// TestBatcherGroups pins how batch entries are split into scripts: on a
// single node in request order by BatchChunk and by result bytes; on a
// cluster by shard, a key's entries staying in one script in order.
func TestBatcherGroups(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	s, err := New(context.Background(), Config{Client: c, SkipChecks: true, BatchChunk: 3, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	groups := func(sizes []int, shards []string) [][]int {
		b := s.newBatcher(completeBatchScript)
		for i, n := range sizes {
			b.add(i, shards[i], n)
		}
		var out [][]int
		for _, g := range b.groups {
			out = append(out, g.idx)
		}
		return out
	}
	tests := []struct {
		name    string
		cluster bool
		sizes   []int
		shards  []string
		want    string
	}{
		{"chunks", false, []int{0, 0, 0, 0, 0, 0, 0}, []string{"0", "1", "0", "1", "0", "1", "0"}, "[[0 1 2] [3 4 5] [6]]"},
		{"bytes", false, []int{1, maxChunkBytes, 1, maxChunkBytes + 5, 0}, []string{"0", "0", "0", "0", "0"}, "[[0] [1] [2] [3] [4]]"},
		{"by shard", true, []int{0, 0, 0, 0, 0, 0, 0}, []string{"0", "1", "0", "1", "0", "1", "0"}, "[[0 2 4] [1 3 5] [6]]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.cluster = tc.cluster
			if got := fmt.Sprint(groups(tc.sizes, tc.shards)); got != tc.want {
				t.Fatalf("groups %s, want %s", got, tc.want)
			}
		})
	}
}
