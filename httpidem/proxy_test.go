package httpidem_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/httpidem"
)

// droppingUpstream is an HTTP/1.1 server that answers requests on a
// keep-alive connection, except those whose key contains "drop": it reads
// such a request whole, counts it, and closes the connection without an
// answer, as a server that crashed after applying it would.
type droppingUpstream struct {
	ln   net.Listener
	mu   sync.Mutex
	hits map[string]int
	wg   sync.WaitGroup
}

func newDroppingUpstream(t *testing.T) *droppingUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &droppingUpstream{ln: ln, hits: map[string]int{}}
	u.wg.Add(1)
	go u.accept()
	t.Cleanup(func() { ln.Close(); u.wg.Wait() })
	return u
}

func (u *droppingUpstream) accept() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				key := strings.Trim(req.Header.Get("Idempotency-Key"), `"`)
				u.mu.Lock()
				u.hits[key]++
				u.mu.Unlock()
				if strings.Contains(key, "drop") {
					return // connection closed after reading the request
				}
				io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
			}
		}()
	}
}

func (u *droppingUpstream) n(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[key]
}

func (u *droppingUpstream) url() *url.URL {
	return &url.URL{Scheme: "http", Host: u.ln.Addr().String()}
}

func proxyTo(t *testing.T, upstream *url.URL, timeout time.Duration, transport http.RoundTripper) string {
	t.Helper()
	p, err := httpidem.NewProxy(httpidem.ProxyConfig{Upstream: upstream, Timeout: timeout, Transport: transport, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if transport != nil {
		if tr, ok := transport.(*http.Transport); ok {
			t.Cleanup(tr.CloseIdleConnections)
		}
	}
	return serve(t, httpidem.Config{Store: newMem(t)}, p)
}

// An upstream that drops the connection after reading a request gets it
// once: the proxy's transport never re-sends it on its own, and the 502 is
// not stored, so the client's own retry is forwarded. The same exchange
// through a plain http.Transport shows the re-send this guards against: a
// request with an Idempotency-Key header and no body (ReverseProxy sends an
// empty body as none) is "replayable" to it.
func TestProxyForwardsOnceOnDroppedConnection(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport func() http.RoundTripper
		emptyHits int // upstream hits of a dropped request without a body
	}{
		{"once transport", func() http.RoundTripper { return nil }, 1},
		{"plain http.Transport (control)", func() http.RoundTripper { return http.DefaultTransport.(*http.Transport).Clone() }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newDroppingUpstream(t)
			url := proxyTo(t, up.url(), 5*time.Second, tc.transport())
			for _, body := range []string{"payload", ""} {
				// Warm a keep-alive connection: the transport re-sends only on
				// a reused one.
				if a := send(t, "POST", url+"/orders", `"warm-`+body+`"`, "w"); a.code != 201 {
					t.Fatalf("warm-up: %d %s", a.code, a.body)
				}
				key := "drop-" + body
				if a := send(t, "POST", url+"/orders", `"`+key+`"`, body); a.code != http.StatusBadGateway {
					t.Fatalf("dropped: %d %s", a.code, a.body)
				}
				want := 1
				if body == "" {
					want = tc.emptyHits
				}
				if got := up.n(key); got != want {
					t.Fatalf("body %q: upstream got the request %d times, want %d", body, got, want)
				}
			}
			// The 502 released the key: the client's own retry goes through.
			send(t, "POST", url+"/orders", `"drop-payload"`, "payload")
			if got := up.n("drop-payload"); got != 2 {
				t.Fatalf("client retry: upstream hits %d, want 2", got)
			}
		})
	}
}

func TestProxyTimeoutReleasesKey(t *testing.T) {
	var slow atomic.Bool
	slow.Store(true)
	var hits atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body) // then the server notices the proxy hanging up
		if slow.Load() {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, "created")
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	url := proxyTo(t, u, 100*time.Millisecond, nil)

	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != http.StatusGatewayTimeout || !strings.Contains(a.body, "upstream-timeout") {
		t.Fatalf("slow upstream: %d %s", a.code, a.body)
	}
	slow.Store(false)
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 201 || a.body != "created" {
		t.Fatalf("retry: %d %s", a.code, a.body)
	}
	if a := send(t, "POST", url+"/x", `"k"`, "b"); a.code != 201 || a.hdr.Get(httpidem.ReplayHeader) != "true" {
		t.Fatalf("replay: %d %v", a.code, a.hdr)
	}
	if hits.Load() != 2 {
		t.Fatalf("upstream hit %d times, want 2", hits.Load())
	}
}

func TestProxyConfig(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "http://", "localhost:80"} {
		pu, _ := url.Parse(u)
		if _, err := httpidem.NewProxy(httpidem.ProxyConfig{Upstream: pu}); err == nil {
			t.Errorf("upstream %q accepted", u)
		}
	}
	if _, err := httpidem.NewProxy(httpidem.ProxyConfig{}); err == nil {
		t.Error("no upstream accepted")
	}
}
