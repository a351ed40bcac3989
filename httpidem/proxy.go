package httpidem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

// DefaultUpstreamTimeout bounds a whole upstream exchange in NewProxy.
const DefaultUpstreamTimeout = 30 * time.Second

// ProxyConfig configures NewProxy.
type ProxyConfig struct {
	// Upstream is the API requests are forwarded to. Required.
	Upstream *url.URL
	// Timeout bounds each upstream exchange, body included (default 30s).
	// Past it the answer is 504, which the middleware does not store.
	Timeout time.Duration
	// Transport sends the requests (default NewTransport()). Whatever it
	// is, it must never send a request twice: see OnceTransport.
	Transport http.RoundTripper
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// NewProxy returns a reverse proxy to cfg.Upstream that forwards each
// request once. An upstream it cannot reach, that drops the connection or
// that exceeds the timeout gets 502 or 504: statuses the middleware does
// not store, so the client may retry with the same key. Put it behind
// Middleware.Handler for `idem proxy`.
func NewProxy(cfg ProxyConfig) (http.Handler, error) {
	if cfg.Upstream == nil || cfg.Upstream.Host == "" || (cfg.Upstream.Scheme != "http" && cfg.Upstream.Scheme != "https") {
		return nil, fmt.Errorf("httpidem: upstream %v: want an http:// or https:// URL with a host", cfg.Upstream)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("httpidem: negative upstream timeout %s", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultUpstreamTimeout
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	up := cfg.Upstream
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
		},
		Transport: cfg.Transport,
		ErrorLog:  slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status, kind, title := http.StatusBadGateway, "upstream-failed", "Upstream failed"
			if errors.Is(err, context.DeadlineExceeded) {
				status, kind, title = http.StatusGatewayTimeout, "upstream-timeout", "Upstream timed out"
			}
			cfg.Logger.Warn("httpidem: upstream failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
			problem(w, status, kind, title, "the upstream did not answer; the request may or may not have been processed")
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), cfg.Timeout)
		defer cancel()
		rp.ServeHTTP(w, r.WithContext(ctx))
	}), nil
}

// NewTransport is NewProxy's default transport: a clone of
// http.DefaultTransport (dial, TLS and idle timeouts) behind OnceTransport.
func NewTransport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return OnceTransport(t)
}

// OnceTransport makes base send each request at most once. http.Transport
// re-sends a request on its own when a reused keep-alive connection breaks
// before the answer, if it thinks the request replayable: GET, HEAD,
// OPTIONS and TRACE, and any request carrying an Idempotency-Key header,
// when it has no body or can rewind it (GetBody). For a proxy that stores
// the first answer under that very key, an upstream that read the request,
// applied it and then lost the connection would apply it twice. So every
// request goes out with a body the transport cannot rewind. (A POST, PUT or
// PATCH with an empty body is then sent with "Transfer-Encoding: chunked"
// and a zero-length body.)
func OnceTransport(base http.RoundTripper) http.RoundTripper { return onceTransport{base} }

type onceTransport struct{ base http.RoundTripper }

func (t onceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	out := *r // a RoundTripper must not modify its request
	out.GetBody = nil
	if out.Body == nil || out.Body == http.NoBody {
		out.Body = emptyBody{}
	}
	return t.base.RoundTrip(&out)
}

// emptyBody is an empty body that is neither nil nor http.NoBody, the two
// the transport treats as replayable.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }
