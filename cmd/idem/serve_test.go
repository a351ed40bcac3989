package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/memstore"
)

// syncBuffer is a bytes.Buffer safe for a logger writing while a test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// running is an `idem serve` or `idem proxy` started in this process.
type running struct {
	url    string
	stderr *syncBuffer
	stop   func() int // cancels (as SIGTERM does) and returns the exit code
}

// start runs the command line until stop; it returns once the server
// listens (or fails the test with the command's output if it exits).
func start(t *testing.T, args ...string) *running {
	t.Helper()
	addrs := make(chan net.Addr, 1)
	testHookListening = func(a net.Addr) { addrs <- a }
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{stderr: &syncBuffer{}}
	done := make(chan int, 1)
	go func() { done <- runContext(ctx, args, io.Discard, r.stderr) }()
	select {
	case a := <-addrs:
		r.url = "http://" + a.String()
	case code := <-done:
		cancel()
		t.Fatalf("%v exited %d before listening:\n%s", args, code, r.stderr)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("%v did not listen within 30s:\n%s", args, r.stderr)
	}
	testHookListening = nil
	var once sync.Once
	code := 0
	r.stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(60 * time.Second):
				t.Errorf("%v did not stop within 60s", args)
				code = -1
			}
		})
		return code
	}
	t.Cleanup(func() { r.stop() })
	return r
}

type httpReply struct {
	code int
	hdr  http.Header
	body string
	m    map[string]any
}

var testClient = &http.Client{Timeout: 30 * time.Second}

func call(t *testing.T, method, url, token, body string, hdr ...string) httpReply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := httpReply{code: resp.StatusCode, hdr: resp.Header, body: string(b)}
	json.Unmarshal(b, &r.m)
	return r
}

// Every flag of serve and proxy can come from the environment, and --help
// says which variable.
func TestServeAndProxyHelpListEnv(t *testing.T) {
	root := newRoot(io.Discard, io.Discard)
	for _, name := range []string{"serve", "proxy"} {
		cmd, _, err := root.Find([]string{name})
		if err != nil || cmd.Name() != name {
			t.Fatalf("no %s command: %v", name, err)
		}
		code, out, errs := cli(t, name, "--help")
		if code != 0 {
			t.Fatalf("%s --help: %d %s", name, code, errs)
		}
		n := 0
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			n++
			env := f.Annotations[envAnnotation]
			if len(env) != 1 || !strings.HasPrefix(env[0], "IDEM_"+strings.ToUpper(name)+"_") {
				t.Errorf("%s --%s: environment variable %v", name, f.Name, env)
				return
			}
			if !strings.Contains(out, "--"+f.Name) || !strings.Contains(out, "[$"+env[0]+"]") {
				t.Errorf("%s --help does not list --%s with $%s", name, f.Name, env[0])
			}
		})
		if n < 10 {
			t.Errorf("%s has only %d flags", name, n)
		}
	}
}

func TestServeAndProxyUsageErrors(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokFile, []byte("# comment\nno-colon-here-0123456789\n"), 0o600)
	for _, tc := range []struct {
		args []string
		env  [2]string
		msg  string
	}{
		{args: []string{"serve", "--addr", "nope"}, msg: "--addr"},
		{args: []string{"serve", "--auth-token", "a:short"}, msg: "at least 16"},
		{args: []string{"serve", "--auth-token", "0123456789abcdef0123"}, msg: "NAMESPACE:TOKEN"},
		{args: []string{"serve", "--auth-token", "bad ns:0123456789abcdef"}, msg: "namespace"},
		{args: []string{"serve", "--auth-token", "a:0123456789abcdef", "--auth-token", "b:0123456789abcdef"}, msg: "twice"},
		{args: []string{"serve", "--auth-token-file", tokFile}, msg: "line 2"},
		{args: []string{"serve", "--auth-token-file", "/nonexistent/tokens"}, msg: "--auth-token-file"},
		{args: []string{"serve", "--read-timeout", "0s"}, msg: "--read-timeout"},
		{args: []string{"serve", "--log-format", "xml"}, msg: "--log-format"},
		{args: []string{"serve", "--log-level", "loud"}, msg: "--log-level"},
		{args: []string{"serve", "--max-batch", "0"}, msg: "--max-batch"},
		{args: []string{"serve", "--lease", "0s"}, msg: "--lease"},
		{args: []string{"serve", "--store-timeout", "1m"}, msg: "--write-timeout"},
		{args: []string{"serve", "--store", "bogus://x"}, msg: "unknown scheme"},
		{args: []string{"serve"}, env: [2]string{"IDEM_SERVE_MAX_BATCH", "lots"}, msg: "IDEM_SERVE_MAX_BATCH"},
		{args: []string{"proxy"}, msg: "--upstream is required"},
		{args: []string{"proxy", "--upstream", "ftp://x"}, msg: "--upstream"},
		{args: []string{"proxy", "--upstream", "http://x", "--require-key", "payments"}, msg: "--require-key"},
		{args: []string{"proxy", "--upstream", "http://x", "--upstream-timeout", "2m"}, msg: "--write-timeout"},
		{args: []string{"proxy"}, env: [2]string{"IDEM_PROXY_UPSTREAM", "localhost:80"}, msg: "--upstream"},
	} {
		if tc.env[0] != "" {
			t.Setenv(tc.env[0], tc.env[1])
		}
		code, _, errs := cli(t, append([]string{"--store", "memory://"}, tc.args...)...)
		if tc.env[0] != "" {
			os.Unsetenv(tc.env[0])
		}
		if code != exitUsage || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want %d mentioning %q", tc.args, code, errs, exitUsage, tc.msg)
		}
		if strings.Contains(errs, "0123456789abcdef") {
			t.Errorf("%v: a token is echoed: %q", tc.args, errs)
		}
	}
}

// idem serve on the memory store with tokens from the environment:
// namespaces are separate, the request log names no key, and SIGTERM (a
// cancelled context) stops it with exit 0.
func TestServeAuthFromEnv(t *testing.T) {
	const tokA, tokB = "token-of-tenant-a-0001", "token-of-tenant-b-0002"
	t.Setenv("IDEM_SERVE_AUTH_TOKENS", "tenant-a:"+tokA+",tenant-b:"+tokB)
	t.Setenv("IDEM_STORE", "memory://")
	s := start(t, "serve", "--addr", "127.0.0.1:0", "--log-format", "json")

	if r := call(t, "POST", s.url+"/v1/claim", "", `{"key":"secret-key-1"}`); r.code != 401 {
		t.Fatalf("no token: %d %s", r.code, r.body)
	}
	r := call(t, "POST", s.url+"/v1/claim", tokA, `{"key":"secret-key-1"}`)
	if r.code != 201 {
		t.Fatalf("tenant a claim: %d %s", r.code, r.body)
	}
	if r := call(t, "GET", s.url+"/v1/records?key=secret-key-1", tokB, ""); r.code != 404 {
		t.Fatalf("tenant b sees a's key: %d %s", r.code, r.body)
	}
	if r := call(t, "POST", s.url+"/v1/claim", tokB, `{"key":"secret-key-1"}`); r.code != 201 {
		t.Fatalf("tenant b claim: %d %s", r.code, r.body)
	}
	if r := call(t, "GET", s.url+"/readyz", "", ""); r.code != 200 {
		t.Fatalf("readyz: %d", r.code)
	}
	if code := s.stop(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, s.stderr)
	}
	logs := s.stderr.String()
	if strings.Contains(logs, "secret-key-1") || strings.Contains(logs, tokA) {
		t.Fatalf("the log holds a key or a token:\n%s", logs)
	}
	var lines int
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if rec["msg"] == "http request" {
			lines++
			if rec["path"] == "/v1/claim" && rec["status"] == float64(201) && rec["namespace"] == nil {
				t.Fatalf("request log without namespace: %q", l)
			}
		}
	}
	if lines != 5 {
		t.Fatalf("%d request log lines, want 5:\n%s", lines, logs)
	}
}

// Two instances of idem serve on one shared store, and a claim storm split
// across them: each key is acquired exactly once; a result recorded
// through one is replayed by the other.
func TestServeTwoInstancesOneStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return redisURL(t) }},
		{"postgres", func(t *testing.T) string {
			// The plain layout: the storm's keys are not Snowflake ids.
			return strings.Split(pgURL(t), "&layout=")[0]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"serve", "--store", tc.url(t), "--namespace", unique("serve-"), "--addr", "127.0.0.1:0",
				"--ttl", "10m", "--log-level", "warn", "--migrate"}
			a := start(t, args...)
			b := start(t, args...)
			instances := []string{a.url, b.url}

			const keys, workers = 100, 8
			var mu sync.Mutex
			acquired := map[string][]string{} // key -> instances that acquired it
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for _, k := range rng.Perm(keys) {
						inst := instances[rng.IntN(2)]
						key := fmt.Sprintf("storm-%d", k)
						r := call(t, "POST", inst+"/v1/claim", "", `{"key":"`+key+`","lease_ms":600000}`)
						switch r.code {
						case 201:
							mu.Lock()
							acquired[key] = append(acquired[key], inst)
							mu.Unlock()
						case 409:
						default:
							t.Errorf("claim %s on %s: %d %s", key, inst, r.code, r.body)
						}
					}
				}()
			}
			wg.Wait()
			for k := range keys {
				key := fmt.Sprintf("storm-%d", k)
				if n := len(acquired[key]); n != 1 {
					t.Errorf("%s acquired %d times (%v)", key, n, acquired[key])
				}
			}
			// Both instances took part.
			per := map[string]int{}
			for _, insts := range acquired {
				per[insts[0]]++
			}
			if per[a.url] == 0 || per[b.url] == 0 {
				t.Fatalf("acquisitions per instance: %v", per)
			}

			// Complete on one, replay on the other; a stale token is fenced on
			// either.
			rec := call(t, "GET", a.url+"/v1/records?key=storm-0", "", "")
			tok := int64(rec.m["token"].(float64))
			if r := call(t, "POST", b.url+"/v1/complete", "", fmt.Sprintf(`{"key":"storm-0","token":%d,"result":"done"}`, tok)); r.code != 200 {
				t.Fatalf("complete via b: %d %s", r.code, r.body)
			}
			if r := call(t, "POST", a.url+"/v1/claim", "", `{"key":"storm-0"}`); r.code != 200 || r.m["result"] != "done" || r.m["replayed"] != true {
				t.Fatalf("replay via a: %d %s", r.code, r.body)
			}
			if r := call(t, "POST", a.url+"/v1/complete", "", fmt.Sprintf(`{"key":"storm-1","token":%d}`, tok)); r.code != 409 {
				t.Fatalf("another key's token: %d %s", r.code, r.body)
			}
			// A batch on each, one store round trip each, agreeing.
			batch := `{"claims":[{"key":"storm-0"},{"key":"storm-1"},{"key":"fresh-1"}]}`
			ra := call(t, "POST", a.url+"/v1/claim/batch", "", batch)
			rb := call(t, "POST", b.url+"/v1/claim/batch", "", batch)
			var got []string
			for _, r := range []httpReply{ra, rb} {
				for _, e := range r.m["results"].([]any) {
					got = append(got, fmt.Sprint(e.(map[string]any)["status"]))
				}
			}
			if want := "[completed in_progress acquired completed in_progress in_progress]"; fmt.Sprint(got) != want {
				t.Fatalf("batches: %v, want %s", got, want)
			}
			for _, s := range []*running{a, b} {
				if code := s.stop(); code != 0 {
					t.Fatalf("exit %d:\n%s", code, s.stderr)
				}
			}
		})
	}
}

// redisURL is the test Redis with a key prefix of this test's own, whose
// keys are dropped after it.
func redisURL(t testing.TB) string {
	prefix := unique("idem-serve-test-") + ":"
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() {
		defer c.Close()
		ctx := context.Background()
		var cur uint64
		for {
			keys, next, err := c.Scan(ctx, cur, prefix+"*", 1000).Result()
			if err != nil {
				t.Errorf("dropping %s*: %v", prefix, err)
				return
			}
			if len(keys) > 0 {
				c.Unlink(ctx, keys...)
			}
			if cur = next; cur == 0 {
				return
			}
		}
	})
	return "redis://127.0.0.1:6379/0?prefix=" + prefix
}

// A shutdown drains: /readyz turns 503 at once, the request in flight when
// it began finishes with its answer, then the listener is gone.
func TestGracefulShutdownDrains(t *testing.T) {
	mem, _ := memstore.New(memstore.Config{})
	defer mem.Close()
	h, err := httpapi.New(httpapi.Config{Store: &slowClaims{Store: mem, delay: 700 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	f := serverFlags{addr: "127.0.0.1:0", readHeaderTimeout: time.Second, readTimeout: 5 * time.Second, writeTimeout: 5 * time.Second,
		idleTimeout: 5 * time.Second, maxHeaderBytes: 1 << 16, shutdownTimeout: 10 * time.Second, drainDelay: 300 * time.Millisecond,
		logFormat: "text", logLevel: "info"}
	addrs := make(chan net.Addr, 1)
	testHookListening = func(a net.Addr) { addrs <- a }
	defer func() { testHookListening = nil }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	log, _ := f.logger(&logs)
	stopped := make(chan error, 1)
	go func() { stopped <- runServer(ctx, f, h, h.Drain, log) }()
	url := "http://" + (<-addrs).String()

	inFlight := make(chan httpReply, 1)
	go func() { inFlight <- call(t, "POST", url+"/v1/claim", "", `{"key":"slow"}`) }()
	time.Sleep(200 * time.Millisecond) // the claim is now inside the store
	cancel()                           // SIGTERM
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-inFlight:
		t.Fatalf("the slow request finished before the shutdown could drain it: %d", r.code)
	default:
	}
	if r := call(t, "GET", url+"/readyz", "", ""); r.code != 503 || r.m["status"] != "draining" {
		t.Fatalf("readyz while draining: %d %s", r.code, r.body)
	}
	if r := <-inFlight; r.code != 201 {
		t.Fatalf("in-flight request: %d %s", r.code, r.body)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("runServer: %v\n%s", err, logs.String())
	}
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), time.Second); err == nil {
		t.Fatal("still accepting connections after shutdown")
	}
}

// slowClaims makes every claim take delay, as a distant store would.
type slowClaims struct {
	*memstore.Store
	delay time.Duration
}

func (s *slowClaims) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	time.Sleep(s.delay)
	return s.Store.Claim(ctx, req)
}

func TestProxyCommand(t *testing.T) {
	var mu sync.Mutex
	hits := 0
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		n := hits
		mu.Unlock()
		w.WriteHeader(201)
		fmt.Fprintf(w, "order %d", n)
	}))
	defer upstream.Close()
	p := start(t, "proxy", "--store", "memory://", "--upstream", upstream.URL, "--addr", "127.0.0.1:0",
		"--require-key", "/orders", "--key-scope-header", "Authorization")
	first := call(t, "POST", p.url+"/orders", "", "x", "Idempotency-Key", `"k1"`, "Authorization", "Bearer alice")
	again := call(t, "POST", p.url+"/orders", "", "x", "Idempotency-Key", `"k1"`, "Authorization", "Bearer alice")
	other := call(t, "POST", p.url+"/orders", "", "x", "Idempotency-Key", `"k1"`, "Authorization", "Bearer bob")
	if first.code != 201 || again.body != first.body || again.hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %q, again %d %q %v", first.code, first.body, again.code, again.body, again.hdr)
	}
	if other.body == first.body || other.hdr.Get("Idempotent-Replayed") != "" {
		t.Fatalf("another principal got alice's answer: %q", other.body)
	}
	if r := call(t, "POST", p.url+"/orders", "", "x"); r.code != 400 {
		t.Fatalf("no key: %d", r.code)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.stderr)
	}
	if hits != 2 {
		t.Fatalf("upstream hit %d times, want 2", hits)
	}
	if logs := p.stderr.String(); !strings.Contains(logs, "replayed=true") {
		t.Fatalf("access log lacks the replay:\n%s", logs)
	}
}
