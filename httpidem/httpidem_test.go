package httpidem_test

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/httpidem"
	"github.com/idem-dev/idem/memstore"
)

var quiet = slog.New(slog.DiscardHandler)

func newMem(t *testing.T) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// serve runs next behind the middleware and returns the server's URL.
func serve(t *testing.T, cfg httpidem.Config, next http.Handler) string {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	m, err := httpidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(m.Handler(next))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handler panics are expected in some tests
	srv.Start()
	t.Cleanup(func() {
		srv.Client().CloseIdleConnections()
		srv.Close()
		m.Close()
	})
	return srv.URL
}

type answer struct {
	code int
	hdr  http.Header
	body string
}

func send(t *testing.T, method, url, key, body string, hdr ...string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{code: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// counter is an upstream handler that counts its runs per key.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
	// status per run number of a key (1-based); default 201
	status func(key string, run int) int
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := strings.Trim(r.Header.Get("Idempotency-Key"), `"`)
	c.mu.Lock()
	if c.runs == nil {
		c.runs = map[string]int{}
	}
	c.runs[key]++
	n := c.runs[key]
	c.mu.Unlock()
	status := 201
	if c.status != nil {
		status = c.status(key, n)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/42")
	w.Header().Add("Set-Cookie", "a=1")
	w.Header().Add("Set-Cookie", "b=2")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"run":%d,"body":%q}`, n, body)
}

func (c *counter) n(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[key]
}

func TestFirstRunThenReplay(t *testing.T) {
	up := &counter{}
	url := serve(t, httpidem.Config{Store: newMem(t)}, up)

	first := send(t, "POST", url+"/orders", `"order-7"`, `{"qty":1}`)
	if first.code != 201 || first.hdr.Get(httpidem.ReplayHeader) != "" {
		t.Fatalf("first: %d %v %s", first.code, first.hdr, first.body)
	}
	for i := 0; i < 3; i++ {
		again := send(t, "POST", url+"/orders", `"order-7"`, `{"qty":1}`)
		if again.code != 201 || again.body != first.body || again.hdr.Get(httpidem.ReplayHeader) != "true" {
			t.Fatalf("replay %d: %d %q %v", i, again.code, again.body, again.hdr)
		}
		if again.hdr.Get("Location") != "/orders/42" || len(again.hdr.Values("Set-Cookie")) != 2 || again.hdr.Get("Content-Type") != "application/json" {
			t.Fatalf("replay lost headers: %v", again.hdr)
		}
		if again.hdr.Get("Date") == "" {
			t.Fatal("replay without its own Date")
		}
	}
	if n := up.n("order-7"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
	// The bare (unquoted) form of the same key is the same key.
	if a := send(t, "POST", url+"/orders", `order-7`, `{"qty":1}`); a.hdr.Get(httpidem.ReplayHeader) != "true" {
		t.Fatalf("bare key: %d %v", a.code, a.hdr)
	}
	// Methods not guarded pass through, key or not.
	send(t, "GET", url+"/orders", `"order-7"`, "")
	send(t, "GET", url+"/orders", `"order-7"`, "")
	if n := up.n("order-7"); n != 3 {
		t.Fatalf("GETs: upstream ran %d times, want 3", n)
	}
}

func TestKeyReusedWithAnotherRequest(t *testing.T) {
	up := &counter{}
	url := serve(t, httpidem.Config{Store: newMem(t)}, up)
	send(t, "POST", url+"/orders", `"k"`, `{"qty":1}`)
	for _, tc := range []struct{ name, method, path, body string }{
		{"body", "POST", "/orders", `{"qty":2}`},
		{"path", "POST", "/refunds", `{"qty":1}`},
		{"query", "POST", "/orders?dry=1", `{"qty":1}`},
		{"method", "PUT", "/orders", `{"qty":1}`},
	} {
		a := send(t, tc.method, url+tc.path, `"k"`, tc.body)
		if a.code != 422 || a.hdr.Get("Content-Type") != "application/problem+json" || !strings.Contains(a.body, "key-reused") {
			t.Errorf("%s: %d %s", tc.name, a.code, a.body)
		}
	}
	if n := up.n("k"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

func TestConcurrentRepeatGets409(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	var runs atomic.Int32
	url := serve(t, httpidem.Config{Store: newMem(t), Lease: 20 * time.Second}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		io.WriteString(w, "done")
	}))
	done := make(chan answer)
	go func() { done <- send(t, "POST", url+"/pay", `"p1"`, "x") }()
	<-started
	a := send(t, "POST", url+"/pay", `"p1"`, "x")
	if a.code != 409 || a.hdr.Get("Retry-After") == "" || !strings.Contains(a.body, "key-in-use") {
		t.Fatalf("concurrent repeat: %d %v %s", a.code, a.hdr, a.body)
	}
	close(release)
	if first := <-done; first.code != 200 || first.body != "done" {
		t.Fatalf("first: %d %s", first.code, first.body)
	}
	if a := send(t, "POST", url+"/pay", `"p1"`, "x"); a.code != 200 || a.body != "done" || a.hdr.Get(httpidem.ReplayHeader) != "true" {
		t.Fatalf("after: %d %s", a.code, a.body)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
}

func TestMissingAndInvalidKeys(t *testing.T) {
	up := &counter{}
	url := serve(t, httpidem.Config{Store: newMem(t), RequireKey: []string{"/payments"}}, up)
	if a := send(t, "POST", url+"/payments/new", "", "x"); a.code != 400 || !strings.Contains(a.body, "key-missing") {
		t.Fatalf("missing key: %d %s", a.code, a.body)
	}
	if a := send(t, "GET", url+"/payments/1", "", ""); a.code != 201 {
		t.Fatalf("GET on a required route: %d", a.code)
	}
	if a := send(t, "POST", url+"/other", "", "x"); a.code != 201 {
		t.Fatalf("no key on a free route: %d", a.code)
	}
	long := `"` + strings.Repeat("k", idem.MaxKeyLen+1) + `"`
	for _, key := range []string{`""`, `"abc`, `"a\b"`, `"a";p=1`, `a b`, `"é"`, long} {
		if a := send(t, "POST", url+"/payments/new", key, "x"); a.code != 400 || !strings.Contains(a.body, "key-invalid") {
			t.Errorf("key %q: %d %s", key, a.code, a.body)
		}
	}
	if a := send(t, "POST", url+"/payments/new", "", "x", "Idempotency-Key", `"a"`, "Idempotency-Key", `"b"`); a.code != 400 {
		t.Errorf("two keys: %d %s", a.code, a.body)
	}
	if got := up.n(""); got != 2 {
		t.Fatalf("upstream ran %d times for keyless requests, want 2", got)
	}
}

func TestParseKey(t *testing.T) {
	for in, want := range map[string]string{
		`"abc"`: "abc", `  "a\"b\\c" `: `a"b\c`, `8e03978e-40d5-43e8-bc93-6894a57f9324`: "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"with space"`: "with space",
	} {
		got, err := httpidem.ParseKey(in)
		if err != nil || string(got) != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", `""`, `"`, `"a`, `"a"b`, `"\n"`, `"\x"`, "a\tb", `a"b`, `a,b`} {
		if _, err := httpidem.ParseKey(in); err == nil {
			t.Errorf("ParseKey(%q) accepted", in)
		}
	}
}

// A retryable answer (5xx) is not stored: the key is released and the next
// request runs the handler again.
func TestServerErrorReleasesKey(t *testing.T) {
	up := &counter{status: func(_ string, run int) int {
		if run == 1 {
			return 503
		}
		return 201
	}}
	url := serve(t, httpidem.Config{Store: newMem(t)}, up)
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 503 || a.hdr.Get(httpidem.ReplayHeader) != "" {
		t.Fatalf("first: %d", a.code)
	}
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 201 || !strings.Contains(a.body, `"run":2`) {
		t.Fatalf("retry: %d %s", a.code, a.body)
	}
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 201 || !strings.Contains(a.body, `"run":2`) || a.hdr.Get(httpidem.ReplayHeader) != "true" {
		t.Fatalf("replay: %d %s", a.code, a.body)
	}
	// A 4xx is the answer to this request: stored.
	up4 := &counter{status: func(string, int) int { return 409 }}
	url4 := serve(t, httpidem.Config{Store: newMem(t)}, up4)
	send(t, "POST", url4+"/x", `"k"`, "b")
	if a := send(t, "POST", url4+"/x", `"k"`, "b"); a.code != 409 || a.hdr.Get(httpidem.ReplayHeader) != "true" || up4.n("k") != 1 {
		t.Fatalf("4xx replay: %d %v, %d runs", a.code, a.hdr, up4.n("k"))
	}
}

// A handler that panics gives the key back (the heartbeat would hold it
// otherwise): the retry runs.
func TestPanicReleasesKey(t *testing.T) {
	var runs atomic.Int32
	url := serve(t, httpidem.Config{Store: newMem(t)}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		io.WriteString(w, "ok")
	}))
	if a := send(t, "POST", url+"/x", `"k"`, ""); a.code != -1 {
		t.Fatalf("panicking handler answered %d", a.code)
	}
	if a := send(t, "POST", url+"/x", `"k"`, ""); a.code != 200 || a.body != "ok" {
		t.Fatalf("retry after panic: %d %s", a.code, a.body)
	}
}

func TestStoreDownFailsClosed(t *testing.T) {
	fs := faultstore.New(newMem(t))
	up := &counter{}
	url := serve(t, httpidem.Config{Store: fs}, up)
	fs.SetDown(true)
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 503 || a.hdr.Get("Retry-After") == "" {
		t.Fatalf("store down: %d %s", a.code, a.body)
	}
	if up.n("k") != 0 {
		t.Fatal("handler ran with the store down")
	}
	fs.SetDown(false)
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 201 {
		t.Fatalf("store back: %d", a.code)
	}
}

// A completion the store refuses at first is retried before the answer
// goes out: the client gets it once, and repeats replay it.
func TestCompletionRetriedWhileStoreFlaps(t *testing.T) {
	fs := faultstore.New(newMem(t))
	up := &counter{}
	url := serve(t, httpidem.Config{Store: fs, Lease: 5 * time.Second}, up)
	fs.Inject(faultstore.OpComplete, faultstore.Fault{Err: idem.ErrUnavailable, Times: 2})
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 201 {
		t.Fatalf("first: %d %s", a.code, a.body)
	}
	if n := fs.Calls(faultstore.OpComplete); n < 3 {
		t.Fatalf("%d Complete calls: the fault did not hit the completion", n)
	}
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 201 || a.hdr.Get(httpidem.ReplayHeader) != "true" || up.n("k") != 1 {
		t.Fatalf("repeat: %d %v, %d runs", a.code, a.hdr, up.n("k"))
	}
}

// A response too large to store reaches its client whole; the key is
// marked failed so the request never runs again.
func TestResponseTooLargeToStore(t *testing.T) {
	var runs atomic.Int32
	big := bytes.Repeat([]byte("z"), idem.MaxResultLen+10)
	url := serve(t, httpidem.Config{Store: newMem(t)}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Write(big[:1000])
		w.Write(big[1000:])
	}))
	if a := send(t, "POST", url+"/export", `"k"`, ""); a.code != 200 || len(a.body) != len(big) {
		t.Fatalf("first: %d, %d bytes", a.code, len(a.body))
	}
	if a := send(t, "POST", url+"/export", `"k"`, ""); a.code != 422 || !strings.Contains(a.body, "response-not-stored") {
		t.Fatalf("repeat: %d %s", a.code, a.body)
	}
	if runs.Load() != 1 {
		t.Fatalf("ran %d times", runs.Load())
	}
}

func TestPrincipalScope(t *testing.T) {
	up := &counter{}
	url := serve(t, httpidem.Config{Store: newMem(t), Principal: func(r *http.Request) string { return r.Header.Get("X-User") }}, up)
	a1 := send(t, "POST", url+"/x", `"k"`, "b", "X-User", "alice")
	b1 := send(t, "POST", url+"/x", `"k"`, "b", "X-User", "bob")
	a2 := send(t, "POST", url+"/x", `"k"`, "b", "X-User", "alice")
	if a1.hdr.Get(httpidem.ReplayHeader) != "" || b1.hdr.Get(httpidem.ReplayHeader) != "" || a2.hdr.Get(httpidem.ReplayHeader) != "true" {
		t.Fatalf("alice %v, bob %v, alice again %v", a1.hdr, b1.hdr, a2.hdr)
	}
	if up.n("k") != 2 {
		t.Fatalf("upstream ran %d times, want 2 (one per principal)", up.n("k"))
	}
}

func TestBodyLimit(t *testing.T) {
	up := &counter{}
	url := serve(t, httpidem.Config{Store: newMem(t), MaxBodyBytes: 10}, up)
	if a := send(t, "POST", url+"/x", `"k"`, strings.Repeat("b", 11)); a.code != 413 {
		t.Fatalf("%d", a.code)
	}
	if up.n("k") != 0 {
		t.Fatal("handler ran")
	}
}

func TestConfigValidate(t *testing.T) {
	s := newMem(t)
	for name, cfg := range map[string]httpidem.Config{
		"no store":      {},
		"bad lease":     {Store: s, Lease: time.Nanosecond},
		"bad ttl":       {Store: s, TTL: -time.Hour},
		"negative body": {Store: s, MaxBodyBytes: -1},
		"bad prefix":    {Store: s, RequireKey: []string{"payments"}},
	} {
		if _, err := httpidem.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The store's record of a request survives the middleware: another
// middleware on the same store (another process) replays it.
func TestSharedStoreAcrossInstances(t *testing.T) {
	store := newMem(t)
	up := &counter{}
	url1 := serve(t, httpidem.Config{Store: store}, up)
	url2 := serve(t, httpidem.Config{Store: store}, up)
	send(t, "POST", url1+"/x", `"k"`, "b")
	if a := send(t, "POST", url2+"/x", `"k"`, "b"); a.hdr.Get(httpidem.ReplayHeader) != "true" || up.n("k") != 1 {
		t.Fatalf("second instance: %d %v, %d runs", a.code, a.hdr, up.n("k"))
	}
}
