package httpidem

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// Defaults of Config.
const (
	DefaultHeader       = "Idempotency-Key"
	ReplayHeader        = "Idempotent-Replayed"
	DefaultLease        = 30 * time.Second
	DefaultTTL          = 24 * time.Hour
	DefaultMaxBodyBytes = 4 << 20
)

// Config configures the middleware. Zero fields take the defaults.
type Config struct {
	// Store keeps the records: one namespace's handle. Required.
	Store idem.Store
	// Header carries the key (default "Idempotency-Key").
	Header string
	// Methods are guarded (default POST, PUT, PATCH, DELETE). Requests with
	// other methods pass through untouched, key or not.
	Methods []string
	// RequireKey lists path prefixes where a guarded request without a key
	// gets 400. Elsewhere a request without a key passes through.
	RequireKey []string
	// Principal, when set, scopes keys to the principal it returns for a
	// request (a user or client id, taken from what your authentication
	// established, never from something the client chooses freely): two
	// principals using the same key never share a record. Keys are always
	// scoped to the Store's namespace.
	Principal func(*http.Request) string
	// Lease is how long a request holds its key before another may take
	// it over should this process die; a heartbeat extends it while the
	// request runs (default 30s).
	Lease time.Duration
	// TTL is how long a stored response is replayed (default 24h).
	TTL time.Duration
	// MaxBodyBytes bounds a guarded request's body, which is read whole to
	// fingerprint it; a larger body gets 413 (default 4 MiB).
	MaxBodyBytes int64
	// Retryable reports the statuses whose responses are not stored: the
	// key is released so the client may try again. Default: 5xx, 408, 425
	// and 429.
	Retryable func(status int) bool
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Hooks observe the underlying guard (claims, settles).
	Hooks idem.Hooks
}

// DefaultRetryable is Config.Retryable's default: server errors and the
// statuses that say the request was not processed.
func DefaultRetryable(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooEarly || status == http.StatusTooManyRequests
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.Store == nil {
		return fmt.Errorf("%w: httpidem: nil Store", idem.ErrInvalidArgument)
	}
	if c.Lease != 0 {
		if err := idem.ValidateLease(c.Lease); err != nil {
			return fmt.Errorf("httpidem: Lease: %w", err)
		}
	}
	if c.TTL != 0 {
		if err := idem.ValidateTTL(c.TTL); err != nil {
			return fmt.Errorf("httpidem: TTL: %w", err)
		}
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("%w: httpidem: MaxBodyBytes %d < 0", idem.ErrInvalidArgument, c.MaxBodyBytes)
	}
	for _, p := range c.RequireKey {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("%w: httpidem: RequireKey %q does not start with /", idem.ErrInvalidArgument, p)
		}
	}
	return nil
}

// Middleware applies the Idempotency-Key semantics
// (draft-ietf-httpapi-idempotency-key-header) in front of a handler:
//
//   - the first request with a key runs the handler once; its response
//     (status, headers, body) is stored under the key;
//   - a repeat gets the stored response, marked "Idempotent-Replayed: true";
//   - a repeat while the first is still running gets 409 with Retry-After;
//   - the same key with another request (method, path and query, body)
//     gets 422;
//   - a guarded request without a key on a RequireKey route gets 400;
//   - a response with a Retryable status (5xx by default) is not stored:
//     the key is released and the client may retry it;
//   - the store unreachable: 503, the handler does not run (fail closed).
//
// Errors are application/problem+json (RFC 9457).
type Middleware struct {
	cfg     Config
	guard   *idem.Guard
	methods map[string]bool
	log     *slog.Logger
}

// New returns the middleware. Close it to stop its guard's goroutines.
func New(cfg Config) (*Middleware, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Header == "" {
		cfg.Header = DefaultHeader
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{"POST", "PUT", "PATCH", "DELETE"}
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Retryable == nil {
		cfg.Retryable = DefaultRetryable
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// No attempt limit: a client may retry a released key as often as it
	// likes; nothing marks a key failed but a response too large to store.
	g, err := idem.NewGuard(cfg.Store, idem.WithLease(cfg.Lease), idem.WithTTL(cfg.TTL),
		idem.WithLogger(cfg.Logger), idem.WithHooks(cfg.Hooks))
	if err != nil {
		return nil, err
	}
	m := &Middleware{cfg: cfg, guard: g, methods: map[string]bool{}, log: cfg.Logger}
	for _, meth := range cfg.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	return m, nil
}

// Close stops the guard: heartbeats of requests still running and
// background completions. It does not close the Store.
func (m *Middleware) Close() error { return m.guard.Close() }

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

func (m *Middleware) requires(path string) bool {
	for _, p := range m.cfg.RequireKey {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(m.cfg.Header)
	if len(values) == 0 {
		if m.requires(r.URL.Path) {
			problem(w, http.StatusBadRequest, "key-missing", "Idempotency-Key missing", m.cfg.Header+" is required on this route")
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	if len(values) > 1 {
		problem(w, http.StatusBadRequest, "key-invalid", "Invalid Idempotency-Key", m.cfg.Header+" given more than once")
		return
	}
	key, err := ParseKey(values[0])
	if err != nil {
		problem(w, http.StatusBadRequest, "key-invalid", "Invalid Idempotency-Key", err.Error())
		return
	}
	key = m.scope(r, key)
	if len(key) > idem.MaxKeyLen {
		problem(w, http.StatusBadRequest, "key-invalid", "Invalid Idempotency-Key", fmt.Sprintf("%s too long (with its scope %d bytes, the limit is %d)", m.cfg.Header, len(key), idem.MaxKeyLen))
		return
	}
	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	fp := idem.FingerprintOf([]byte(r.Method), []byte(r.URL.RequestURI()), body)
	held, res, err := m.guard.Acquire(r.Context(), key, idem.WithFingerprint(fp))
	if err != nil {
		m.claimError(w, err)
		return
	}
	if held == nil {
		m.replay(w, res.Value)
		return
	}
	m.first(w, r, next, held, body)
}

// scope prefixes the key with the principal (length first, so that no two
// (principal, key) pairs give the same bytes).
func (m *Middleware) scope(r *http.Request, key []byte) []byte {
	if m.cfg.Principal == nil {
		return key
	}
	p := m.cfg.Principal(r)
	b := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(p)+len(key)), uint64(len(p)))
	return append(append(b, p...), key...)
}

func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.ContentLength > m.cfg.MaxBodyBytes {
		problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large", fmt.Sprintf("the limit is %d bytes", m.cfg.MaxBodyBytes))
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large", fmt.Sprintf("the limit is %d bytes", m.cfg.MaxBodyBytes))
		} else {
			problem(w, http.StatusBadRequest, "body-unreadable", "Request body unreadable", err.Error())
		}
		return nil, false
	}
	return body, true
}

func (m *Middleware) claimError(w http.ResponseWriter, err error) {
	var inProgress *idem.InProgressError
	switch {
	case errors.As(err, &inProgress):
		secs := math.Ceil(inProgress.RetryAfter(time.Now()).Seconds())
		w.Header().Set("Retry-After", strconv.Itoa(int(max(secs, 1))))
		problem(w, http.StatusConflict, "key-in-use", "Request in progress", "a request with this key is still being processed; retry later")
	case errors.Is(err, idem.ErrFingerprintMismatch):
		problem(w, http.StatusUnprocessableEntity, "key-reused", "Idempotency-Key reused", "this key was used with another request (method, path or body)")
	case errors.Is(err, idem.ErrFailed):
		// Only a response too large to store fails a key (see first).
		problem(w, http.StatusUnprocessableEntity, "response-not-stored", "Response not stored",
			"the first request with this key was processed but its response could not be stored; it is not run again")
	case errors.Is(err, idem.ErrCorrupt):
		m.log.Error("httpidem: damaged record", "err", err)
		problem(w, http.StatusInternalServerError, "store-error", "Idempotency store error", "the record of this key is damaged")
	default:
		m.log.Warn("httpidem: claim failed", "err", err)
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "store-unavailable", "Idempotency store unavailable", "the request was not processed; retry later")
	}
}

func (m *Middleware) replay(w http.ResponseWriter, stored []byte) {
	resp, err := decodeResponse(stored)
	if err != nil {
		m.log.Error("httpidem: stored response is damaged", "err", err)
		problem(w, http.StatusInternalServerError, "store-error", "Idempotency store error", "the stored response of this key is damaged")
		return
	}
	h := w.Header()
	for name, vs := range resp.header {
		h[name] = vs
	}
	h.Set(ReplayHeader, "true")
	h.Set("Content-Length", strconv.Itoa(len(resp.body)))
	w.WriteHeader(resp.status)
	w.Write(resp.body)
}

// first runs the handler for the request that holds the key and settles
// the key with its response.
func (m *Middleware) first(w http.ResponseWriter, r *http.Request, next http.Handler, held *idem.Held, body []byte) {
	// Settling must not depend on the client staying connected.
	ctx := context.WithoutCancel(r.Context())
	c := &capture{w: w, header: http.Header{}, limit: idem.MaxResultLen}
	settled := false
	defer func() {
		if settled {
			return
		}
		// The handler panicked (http.ErrAbortHandler included): give the
		// key back, or the heartbeat would hold it as long as we run.
		p := recover()
		if err := held.Release(ctx, fmt.Errorf("httpidem: handler did not return: %v", p)); err != nil {
			m.log.Warn("httpidem: release after a panic failed; the key frees when its lease lapses", "err", err)
		}
		if p != nil { // nil: runtime.Goexit, which goes on by itself
			panic(p)
		}
	}()
	r2 := r.Clone(r.Context()) // a handler may keep r; give it its own body
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	r2.GetBody = nil
	next.ServeHTTP(c, r2)
	settled = true
	if c.status == 0 {
		c.status = http.StatusOK
	}
	resp := response{status: c.status, header: c.header, body: c.buf.Bytes()}
	var enc []byte
	if !c.streaming {
		enc = resp.encode()
	}
	switch {
	case m.cfg.Retryable(c.status):
		if err := held.Release(ctx, fmt.Errorf("httpidem: handler answered %d", c.status)); err != nil {
			m.log.Warn("httpidem: release failed; the key frees when its lease lapses", "status", c.status, "err", err)
		}
	case enc == nil || len(enc) > idem.MaxResultLen:
		// Done but too large to store: never run it again.
		err := held.Release(ctx, idem.Permanent(fmt.Errorf("httpidem: response of status %d too large to store", c.status)))
		if !errors.Is(err, idem.ErrFailed) {
			m.log.Warn("httpidem: marking a key whose response is too large failed", "err", err)
		}
	default:
		if err := held.Complete(ctx, enc); err != nil {
			m.log.Warn("httpidem: response not recorded", "err", err)
		}
	}
	if !c.streaming {
		resp.writeTo(w)
	}
}

func (r *response) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for name, vs := range r.header {
		h[name] = vs
	}
	if h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" {
		h.Set("Content-Length", strconv.Itoa(len(r.body)))
	}
	w.WriteHeader(r.status)
	w.Write(r.body)
}

// capture holds the handler's response until it is settled. A body longer
// than limit cannot be stored: from there on it streams to the client.
type capture struct {
	w         http.ResponseWriter
	header    http.Header
	status    int
	buf       bytes.Buffer
	limit     int
	streaming bool
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(code int) {
	if code < 200 || c.status != 0 {
		return // informational responses are not stored or forwarded
	}
	c.status = code
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.streaming {
		return c.w.Write(b)
	}
	if c.buf.Len()+len(b) <= c.limit {
		return c.buf.Write(b)
	}
	c.streaming = true
	resp := response{status: c.status, header: c.header, body: c.buf.Bytes()}
	h := c.w.Header()
	for name, vs := range resp.header {
		h[name] = vs
	}
	c.w.WriteHeader(c.status)
	if _, err := c.w.Write(resp.body); err != nil {
		return 0, err
	}
	c.buf = bytes.Buffer{}
	return c.w.Write(b)
}

// FlushError lets http.ResponseController flush (ReverseProxy does): a
// no-op while the response is held.
func (c *capture) FlushError() error {
	if !c.streaming {
		return nil
	}
	return http.NewResponseController(c.w).Flush()
}

// problem writes an RFC 9457 problem details answer.
func problem(w http.ResponseWriter, status int, kind, title, detail string) {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{ProblemBase + kind, title, status, detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// ProblemBase prefixes the "type" of the middleware's problem answers;
// the fragment names the case in docs/http.md.
const ProblemBase = "https://github.com/idem-dev/idem/blob/main/docs/http.md#"
