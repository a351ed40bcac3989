package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytes = 4 << 20 // a 1 MiB result escaped as JSON text or base64 fits
	DefaultMaxBatch     = 1000
	DefaultStoreTimeout = 10 * time.Second
	DefaultReadyTimeout = 2 * time.Second
	// MinTokenLen is the shortest bearer token accepted: a guessable token
	// is worse than none because it looks like protection.
	MinTokenLen = 16
)

// Config configures the HTTP API. Zero fields take the defaults above.
type Config struct {
	// Store serves every request when Tokens is empty: the namespace of
	// this handle is the only one reachable. Ignored when Tokens is set.
	Store idem.Store
	// Tokens turns authentication on: every /v1 request must carry
	// "Authorization: Bearer <Secret>" of one of them, and works on that
	// token's Store (one namespace's handle) only. A request without a
	// valid token gets 401.
	Tokens []Token
	// Lease and TTL apply to claims that give no lease_ms / ttl_ms
	// (defaults idem.DefaultLease and idem.DefaultTTL).
	Lease time.Duration
	TTL   time.Duration
	// MaxBodyBytes bounds a request body; a larger one gets 413.
	MaxBodyBytes int64
	// MaxBatch bounds the entries of one /v1/claim/batch.
	MaxBatch int
	// StoreTimeout bounds each store call a request makes; past it the
	// answer is 503 store_timeout (the outcome is unknown: retry, or read
	// the record).
	StoreTimeout time.Duration
	// ReadyTimeout bounds the store ping of /readyz.
	ReadyTimeout time.Duration
	// Logger receives one record per request (level Info; Warn for 5xx).
	// Nil: no request log.
	Logger *slog.Logger
	// Metrics, when set, is served at /metrics instead of the built-in
	// Prometheus text (Handler.WriteMetrics), e.g. a client_golang handler
	// whose registry collects WriteMetrics' counters too.
	Metrics http.Handler
	// Dashboard, when set, serves "/" and every path the API does not own.
	Dashboard http.Handler
}

// Token is a bearer token bound to one namespace.
type Token struct {
	// Namespace names Store's namespace in logs and errors.
	Namespace string
	// Secret is what the client sends; at least MinTokenLen bytes.
	Secret string
	// Store is the namespace's handle. Tokens of one namespace may share it.
	Store idem.Store
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if len(c.Tokens) == 0 && c.Store == nil {
		return fmt.Errorf("%w: httpapi: no Store and no Tokens", idem.ErrInvalidArgument)
	}
	seen := make(map[string]bool, len(c.Tokens))
	for i, t := range c.Tokens {
		if err := idem.ValidateNamespace(t.Namespace); err != nil {
			return fmt.Errorf("httpapi: token %d: %w", i, err)
		}
		if len(t.Secret) < MinTokenLen {
			return fmt.Errorf("%w: httpapi: token %d (namespace %q) is %d bytes, the minimum is %d", idem.ErrInvalidArgument, i, t.Namespace, len(t.Secret), MinTokenLen)
		}
		if strings.ContainsAny(t.Secret, " \t\r\n") {
			return fmt.Errorf("%w: httpapi: token %d (namespace %q) contains white space", idem.ErrInvalidArgument, i, t.Namespace)
		}
		if seen[t.Secret] {
			return fmt.Errorf("%w: httpapi: token %d (namespace %q) is given twice", idem.ErrInvalidArgument, i, t.Namespace)
		}
		seen[t.Secret] = true
		if t.Store == nil {
			return fmt.Errorf("%w: httpapi: token %d (namespace %q) has no Store", idem.ErrInvalidArgument, i, t.Namespace)
		}
	}
	if c.Lease != 0 {
		if err := idem.ValidateLease(c.Lease); err != nil {
			return fmt.Errorf("httpapi: Lease: %w", err)
		}
	}
	if c.TTL != 0 {
		if err := idem.ValidateTTL(c.TTL); err != nil {
			return fmt.Errorf("httpapi: TTL: %w", err)
		}
	}
	switch {
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("%w: httpapi: MaxBodyBytes %d < 0", idem.ErrInvalidArgument, c.MaxBodyBytes)
	case c.MaxBatch < 0 || c.MaxBatch > 100_000:
		return fmt.Errorf("%w: httpapi: MaxBatch %d outside [1, 100000]", idem.ErrInvalidArgument, c.MaxBatch)
	case c.StoreTimeout < 0 || c.ReadyTimeout < 0:
		return fmt.Errorf("%w: httpapi: negative timeout", idem.ErrInvalidArgument)
	}
	return nil
}

// Handler serves the HTTP API. It keeps no state of its own besides
// counters: any number of handlers (processes) on one shared store give one
// answer per key, the store's.
type Handler struct {
	cfg      Config
	defaults claimReq
	tokens   []tokenEntry // empty: no auth
	stores   []idem.Store // distinct handles, for readiness
	metrics  metrics
	live     lives // the dashboard's figures, per namespace
	draining atomic.Bool
}

type tokenEntry struct {
	sum   [sha256.Size]byte
	ns    string
	store idem.Store
}

// New returns the API handler.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Lease == 0 {
		cfg.Lease = idem.DefaultLease
	}
	if cfg.TTL == 0 {
		cfg.TTL = idem.DefaultTTL
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	h := &Handler{cfg: cfg, defaults: claimReq{lease: cfg.Lease, ttl: cfg.TTL}}
	for _, t := range cfg.Tokens {
		h.tokens = append(h.tokens, tokenEntry{sum: sha256.Sum256([]byte(t.Secret)), ns: t.Namespace, store: t.Store})
		h.addStore(t.Store)
	}
	if len(h.tokens) == 0 {
		h.addStore(cfg.Store)
	}
	return h, nil
}

func (h *Handler) addStore(s idem.Store) {
	for _, have := range h.stores {
		if have == s {
			return
		}
	}
	h.stores = append(h.stores, s)
}

// Drain makes /readyz answer 503 from now on, so that load balancers stop
// sending new requests while the server shuts down; requests still arrive
// and are served as before.
func (h *Handler) Drain() { h.draining.Store(true) }

// Routes, also the "route" label of the metrics.
const (
	routeClaim = iota
	routeBatch
	routeComplete
	routeRelease
	routeFail
	routeExtend
	routeRecords
	routeStats
	routeRecent
	routeMetrics
	routeHealthz
	routeReadyz
	routeOther
	numRoutes
)

var routeNames = [numRoutes]string{"claim", "claim_batch", "complete", "release", "fail", "extend", "records", "stats", "recent", "metrics", "healthz", "readyz", "other"}

func routeOf(path string) int {
	switch path {
	case "/v1/claim":
		return routeClaim
	case "/v1/claim/batch":
		return routeBatch
	case "/v1/complete":
		return routeComplete
	case "/v1/release":
		return routeRelease
	case "/v1/fail":
		return routeFail
	case "/v1/extend":
		return routeExtend
	case "/v1/records":
		return routeRecords
	case "/v1/stats":
		return routeStats
	case "/v1/recent":
		return routeRecent
	case "/metrics":
		return routeMetrics
	case "/healthz":
		return routeHealthz
	case "/readyz":
		return routeReadyz
	}
	return routeOther
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rt := routeOf(r.URL.Path)
	if rt == routeOther && h.cfg.Dashboard != nil {
		h.cfg.Dashboard.ServeHTTP(w, r)
		return
	}
	h.metrics.inFlight.Add(1)
	rw := &recorder{ResponseWriter: w}
	ns := h.serve(rw, r, rt)
	h.metrics.inFlight.Add(-1)
	d := time.Since(start)
	h.metrics.observe(rt, rw.code, d)
	if rw.live != nil && rt <= routeRecords {
		rw.live.request(rw.code, d)
	}
	if l := h.cfg.Logger; l != nil {
		level := slog.LevelInfo
		if rw.code >= 500 {
			level = slog.LevelWarn
		}
		if l.Enabled(r.Context(), level) {
			attrs := []slog.Attr{
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", rw.code),
				slog.Duration("duration", d), slog.String("remote", r.RemoteAddr),
			}
			if ns != nil {
				attrs = append(attrs, slog.String("namespace", *ns))
			}
			if rw.errCode != "" {
				attrs = append(attrs, slog.String("error", rw.errCode), slog.String("detail", rw.detail))
			}
			l.LogAttrs(r.Context(), level, "http request", attrs...)
		}
	}
}

// serve answers one request and returns the namespace it worked on (nil
// when none).
func (h *Handler) serve(w *recorder, r *http.Request, rt int) *string {
	switch rt {
	case routeHealthz:
		if allow(w, r, "GET", "HEAD") {
			writeJSON(w, http.StatusOK, statusOut{Status: "ok"})
		}
		return nil
	case routeReadyz:
		if allow(w, r, "GET", "HEAD") {
			h.ready(w, r)
		}
		return nil
	case routeMetrics:
		if !allow(w, r, "GET", "HEAD") {
			return nil
		}
		if h.cfg.Metrics != nil {
			h.cfg.Metrics.ServeHTTP(w, r)
			return nil
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		h.WriteMetrics(w)
		return nil
	case routeOther:
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint")
		return nil
	}
	var ok bool
	switch rt {
	case routeRecords:
		ok = allow(w, r, "GET", "HEAD", "DELETE")
	case routeStats, routeRecent:
		ok = allow(w, r, "GET", "HEAD")
	default:
		ok = allow(w, r, "POST")
	}
	if !ok {
		return nil
	}
	store, ns, ok := h.authorize(w, r)
	if !ok {
		return nil
	}
	if ns != nil {
		w.live = h.live.get(*ns)
	} else {
		w.live = h.live.get("")
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.StoreTimeout)
	defer cancel()
	switch rt {
	case routeRecords:
		h.records(ctx, w, r, store)
		return ns
	case routeStats:
		h.stats(ctx, w, store, w.live)
		return ns
	case routeRecent:
		h.recent(ctx, w, store, w.live)
		return ns
	}
	body, ok := h.readBody(w, r)
	if !ok {
		return ns
	}
	switch rt {
	case routeClaim:
		h.claim(ctx, w, store, body)
	case routeBatch:
		h.batch(ctx, w, store, body)
	case routeComplete:
		h.settle(ctx, w, store, body, opComplete)
	case routeRelease:
		h.settle(ctx, w, store, body, opRelease)
	case routeFail:
		h.settle(ctx, w, store, body, opFail)
	case routeExtend:
		h.settle(ctx, w, store, body, opExtend)
	}
	return ns
}

func allow(w *recorder, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here")
	return false
}

// authorize finds the request's store: the token's when tokens are set.
// Every configured token is compared, in constant time, whatever matches,
// so the time taken says nothing about which token or how much of it
// matched.
func (h *Handler) authorize(w *recorder, r *http.Request) (idem.Store, *string, bool) {
	if len(h.tokens) == 0 {
		return h.cfg.Store, nil, true
	}
	auth := r.Header.Get("Authorization")
	scheme, secret, _ := strings.Cut(auth, " ")
	sum := sha256.Sum256([]byte(strings.TrimSpace(secret)))
	found := 0
	idx := 0
	for i := range h.tokens {
		eq := subtle.ConstantTimeCompare(sum[:], h.tokens[i].sum[:])
		idx = subtle.ConstantTimeSelect(eq, i, idx)
		found |= eq
	}
	if found == 0 || !strings.EqualFold(scheme, "Bearer") {
		w.Header().Set("WWW-Authenticate", `Bearer realm="idem"`)
		writeError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
		return nil, nil, false
	}
	t := &h.tokens[idx]
	return t.store, &t.ns, true
}

func (h *Handler) readBody(w *recorder, r *http.Request) ([]byte, bool) {
	if r.ContentLength > h.cfg.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body of %d bytes over the limit of %d", r.ContentLength, h.cfg.MaxBodyBytes))
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body over the limit of %d bytes", h.cfg.MaxBodyBytes))
		} else {
			writeError(w, http.StatusBadRequest, "invalid_request", "reading the body: "+err.Error())
		}
		return nil, false
	}
	return body, true
}

func (h *Handler) claim(ctx context.Context, w *recorder, store idem.Store, body []byte) {
	c, err := decodeClaim(body, h.defaults)
	if err != nil {
		writeBad(w, err)
		return
	}
	cl, err := store.Claim(ctx, idem.ClaimRequest{Key: c.key, Fingerprint: c.fp, Lease: c.lease, TTL: c.ttl})
	if err != nil {
		h.countClaim(w, outcomeOf(err, 0))
		h.storeError(w, store, err)
		return
	}
	h.countClaim(w, outcomeOf(nil, cl.Outcome))
	out, code := claimAnswer(cl)
	if cl.Outcome == idem.OutcomeInProgress {
		w.Header().Set("Retry-After", retryAfter(&cl.Record))
	}
	writeJSON(w, code, out)
}

// claimAnswer is the body and status of a claim's answer.
func claimAnswer(cl idem.Claim) (claimOut, int) {
	rec := &cl.Record
	switch cl.Outcome {
	case idem.OutcomeAcquired:
		lu := rec.LeaseUntil.UTC()
		return claimOut{Status: "acquired", Token: rec.Token, Attempts: rec.Attempts, LeaseUntil: &lu}, http.StatusCreated
	case idem.OutcomeCompleted:
		out := claimOut{Status: "completed", Token: rec.Token, Attempts: rec.Attempts, Replayed: true}
		out.Result, out.ResultB64 = textOrB64(rec.Result, true)
		return out, http.StatusOK
	case idem.OutcomeInProgress:
		lu := rec.LeaseUntil.UTC()
		return claimOut{Status: "in_progress", LeaseUntil: &lu}, http.StatusConflict
	case idem.OutcomeFailed:
		cause := rec.LastError
		return claimOut{Status: "failed", Attempts: rec.Attempts, Error: &cause}, http.StatusOK
	}
	return claimOut{Status: "unknown"}, http.StatusInternalServerError
}

// retryAfter is the Retry-After value for an in-progress record: whole
// seconds until its lease ends, rounded up, at least 1. LeaseUntil is on
// the store's clock, so the wait is bounded by the holder's lease span as
// idem.InProgressError.RetryAfter bounds it: a store clock hours ahead
// must not tell clients to wait hours.
func retryAfter(rec *idem.Record) string {
	s := math.Ceil(idem.InProgressOf(rec).RetryAfter(time.Now()).Seconds())
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(int64(s), 10)
}

func (h *Handler) batch(ctx context.Context, w *recorder, store idem.Store, body []byte) {
	cs, err := decodeBatch(body, h.defaults, h.cfg.MaxBatch)
	if err != nil {
		writeBad(w, err)
		return
	}
	reqs := make([]idem.ClaimRequest, len(cs))
	for i, c := range cs {
		reqs[i] = idem.ClaimRequest{Key: c.key, Fingerprint: c.fp, Lease: c.lease, TTL: c.ttl}
	}
	var res []idem.BatchResult
	if bc, ok := store.(idem.BatchClaimer); ok {
		res, err = bc.ClaimBatch(ctx, reqs)
		if err == nil && len(res) != len(reqs) {
			err = fmt.Errorf("%w: store answered %d results for %d claims", idem.ErrUnknownOutcome, len(res), len(reqs))
		}
	} else {
		// A store without batch claims: one call per key, in order, as the
		// BatchClaimer contract defines the batch.
		res = make([]idem.BatchResult, len(reqs))
		for i := range reqs {
			res[i].Claim, res[i].Err = store.Claim(ctx, reqs[i])
			if res[i].Err != nil && !perKey(res[i].Err) {
				err = res[i].Err
				break
			}
		}
	}
	if err != nil {
		h.countClaim(w, outcomeOf(err, 0))
		h.storeError(w, store, err)
		return
	}
	out := batchOut{Results: make([]claimOut, len(res))}
	for i, r := range res {
		h.countClaim(w, outcomeOf(r.Err, r.Claim.Outcome))
		if r.Err != nil {
			_, code, detail := classify(store, r.Err)
			out.Results[i] = claimOut{Error: &code, Detail: detail}
			continue
		}
		out.Results[i], _ = claimAnswer(r.Claim)
	}
	writeJSON(w, http.StatusOK, out)
}

// perKey reports an error a batch gives one entry, the others proceeding.
func perKey(err error) bool {
	return errors.Is(err, idem.ErrFingerprintMismatch) || errors.Is(err, idem.ErrInvalidKey) ||
		errors.Is(err, idem.ErrInvalidArgument) || errors.Is(err, idem.ErrCorrupt)
}

func (h *Handler) settle(ctx context.Context, w *recorder, store idem.Store, body []byte, op int) {
	s, err := decodeSettle(body, op)
	if err != nil {
		writeBad(w, err)
		return
	}
	var status string
	switch op {
	case opComplete:
		err, status = store.Complete(ctx, s.key, s.token, s.result), "completed"
	case opRelease:
		err, status = store.Release(ctx, s.key, s.token, s.cause), "released"
	case opFail:
		err, status = store.Fail(ctx, s.key, s.token, s.cause), "failed"
	case opExtend:
		err, status = store.Extend(ctx, s.key, s.token, s.lease), "extended"
	}
	if err != nil {
		h.storeError(w, store, err)
		return
	}
	w.noteSettle(op, s)
	writeJSON(w, http.StatusOK, statusOut{Status: status})
}

func (h *Handler) records(ctx context.Context, w *recorder, r *http.Request, store idem.Store) {
	key, err := queryKey(r.URL.RawQuery)
	if err != nil {
		writeBad(w, err)
		return
	}
	if r.Method == http.MethodDelete {
		if err := store.Delete(ctx, key); err != nil {
			h.storeError(w, store, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	rec, err := store.Get(ctx, key)
	if err != nil {
		h.storeError(w, store, err)
		return
	}
	writeJSON(w, http.StatusOK, recordOf(rec))
}

func (h *Handler) ready(w *recorder, r *http.Request) {
	if h.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, statusOut{Status: "draining"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadyTimeout)
	defer cancel()
	for _, s := range h.stores {
		p, ok := s.(idem.Pinger)
		if !ok {
			continue
		}
		if err := p.Ping(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, statusOut{Status: "unavailable", Error: err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, statusOut{Status: "ready"})
}

// storeError answers a store error.
func (h *Handler) storeError(w *recorder, store idem.Store, err error) {
	status, code, detail := classify(store, err)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, status, code, detail)
}

// classify maps a store error onto a status, a code and a detail.
func classify(store idem.Store, err error) (int, string, string) {
	if ec, ok := store.(idem.ErrorClassifier); ok {
		err = ec.ClassifyError(err)
	} else {
		err = idem.ClassifyError(err)
	}
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return http.StatusNotFound, "not_found", "no live record for this key"
	case errors.Is(err, idem.ErrFenced):
		return http.StatusConflict, "fenced", "the token is not the record's current one, or the record is no longer in progress"
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return http.StatusUnprocessableEntity, "fingerprint_mismatch", "the key was first claimed with another fingerprint"
	case errors.Is(err, idem.ErrInvalidKey):
		return http.StatusBadRequest, "invalid_key", err.Error()
	case errors.Is(err, idem.ErrInvalidArgument):
		return http.StatusBadRequest, "invalid_request", err.Error()
	case errors.Is(err, idem.ErrCapacity):
		return http.StatusServiceUnavailable, "capacity", err.Error()
	case errors.Is(err, idem.ErrUnknownOutcome):
		return http.StatusServiceUnavailable, "unknown_outcome", "the store may or may not have applied it: retry (every call is safe to repeat) or read the record"
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, "store_timeout", "the store did not answer in time; it may or may not have applied it: retry or read the record"
	case errors.Is(err, idem.ErrUnavailable), errors.Is(err, idem.ErrClosed):
		return http.StatusServiceUnavailable, "store_unavailable", err.Error()
	case errors.Is(err, context.Canceled):
		return 499, "canceled", "the client went away" // nginx's code; nobody reads it but the log
	case errors.Is(err, idem.ErrCorrupt):
		return http.StatusInternalServerError, "corrupt_record", err.Error()
	}
	return http.StatusInternalServerError, "internal", err.Error()
}

// Responses.

type statusOut struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

type errorOut struct {
	Error  string `json:"error"`
	Detail string `json:"detail,omitempty"`
}

type claimOut struct {
	Status     string     `json:"status,omitempty"`
	Token      uint64     `json:"token,omitempty"`
	Attempts   int        `json:"attempts,omitempty"`
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	Result     *string    `json:"result,omitempty"`
	ResultB64  *string    `json:"result_b64,omitempty"`
	Replayed   bool       `json:"replayed,omitempty"`
	Error      *string    `json:"error,omitempty"`
	Detail     string     `json:"detail,omitempty"`
}

type batchOut struct {
	Results []claimOut `json:"results"`
}

type recordOut struct {
	Key            *string    `json:"key,omitempty"`
	KeyB64         *string    `json:"key_b64,omitempty"`
	State          string     `json:"state"`
	Token          uint64     `json:"token"`
	Attempts       int        `json:"attempts"`
	Fingerprint    *string    `json:"fingerprint,omitempty"`
	FingerprintB64 *string    `json:"fingerprint_b64,omitempty"`
	Result         *string    `json:"result,omitempty"`
	ResultB64      *string    `json:"result_b64,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	LeaseUntil     *time.Time `json:"lease_until,omitempty"`
	ExpiresAt      time.Time  `json:"expires_at"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
}

func recordOf(rec idem.Record) recordOut {
	out := recordOut{
		State: rec.State.String(), Token: rec.Token, Attempts: rec.Attempts, LastError: rec.LastError,
		ExpiresAt: rec.ExpiresAt.UTC(), CreatedAt: rec.CreatedAt.UTC(), UpdatedAt: rec.UpdatedAt.UTC(),
	}
	out.Key, out.KeyB64 = textOrB64(rec.Key, true)
	out.Fingerprint, out.FingerprintB64 = textOrB64(rec.Fingerprint, false)
	if rec.State == idem.StateCompleted {
		out.Result, out.ResultB64 = textOrB64(rec.Result, true)
	}
	if rec.State == idem.StateInProgress {
		lu := rec.LeaseUntil.UTC()
		out.LeaseUntil = &lu
	}
	return out
}

// textOrB64 gives b as JSON text when it is valid UTF-8 and as base64
// otherwise (JSON strings cannot carry other bytes). Empty b is "" when
// always, absent otherwise.
func textOrB64(b []byte, always bool) (text, b64 *string) {
	if len(b) == 0 && !always {
		return nil, nil
	}
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	s := base64.StdEncoding.EncodeToString(b)
	return nil, &s
}

func writeJSON(w *recorder, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // our own types: cannot happen
		code, b = http.StatusInternalServerError, []byte(`{"error":"internal"}`)
	}
	b = append(b, '\n')
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	w.Write(b)
}

func writeError(w *recorder, code int, errCode, detail string) {
	w.errCode, w.detail = errCode, detail
	writeJSON(w, code, errorOut{Error: errCode, Detail: detail})
}

func writeBad(w *recorder, err error) {
	var br *badRequest
	if errors.As(err, &br) {
		writeError(w, http.StatusBadRequest, br.code, br.detail)
		return
	}
	writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
}

// recorder remembers the status and error code for metrics and logs, and
// the namespace's live figures once the request is authorized.
type recorder struct {
	http.ResponseWriter
	code            int
	errCode, detail string
	live            *nsLive
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
