package httpapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/memstore"
)

// api is a test server and its client.
type api struct {
	t   *testing.T
	srv *httptest.Server
	h   *httpapi.Handler
	tok string // bearer token sent, if any
}

func newMem(t *testing.T) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newAPI(t *testing.T, cfg httpapi.Config) *api {
	t.Helper()
	h, err := httpapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Client().CloseIdleConnections()
		srv.Close()
	})
	return &api{t: t, srv: srv, h: h}
}

func (a *api) as(tok string) *api { b := *a; b.tok = tok; return &b }

// reply is a decoded answer.
type reply struct {
	code int
	hdr  http.Header
	raw  string
	m    map[string]any
}

func (r reply) str(name string) string { s, _ := r.m[name].(string); return s }

func (r reply) num(name string) uint64 {
	n, _ := r.m[name].(json.Number)
	v, _ := strconv.ParseUint(string(n), 10, 64)
	return v
}

func (a *api) do(method, path, body string) reply {
	a.t.Helper()
	req, err := http.NewRequest(method, a.srv.URL+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if a.tok != "" {
		req.Header.Set("Authorization", "Bearer "+a.tok)
	}
	resp, err := a.srv.Client().Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{code: resp.StatusCode, hdr: resp.Header, raw: string(raw)}
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&r.m); err != nil {
			a.t.Fatalf("%s %s: answer is not JSON: %v: %q", method, path, err, raw)
		}
	}
	return r
}

func (a *api) post(path, body string) reply { a.t.Helper(); return a.do("POST", path, body) }

func (a *api) want(r reply, code int, fields ...string) {
	a.t.Helper()
	if r.code != code {
		a.t.Fatalf("status %d, want %d: %s", r.code, code, r.raw)
	}
	for i := 0; i+1 < len(fields); i += 2 {
		if got := fmt.Sprint(r.m[fields[i]]); got != fields[i+1] {
			a.t.Fatalf("%s = %q, want %q in %s", fields[i], got, fields[i+1], r.raw)
		}
	}
}

func jsonStr(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestClaimLifecycle(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})

	r := a.post("/v1/claim", `{"key":"order-1","lease_ms":60000}`)
	a.want(r, 201, "status", "acquired", "attempts", "1")
	tok := r.num("token")
	if tok == 0 || r.str("lease_until") == "" {
		t.Fatalf("acquired without token or lease: %s", r.raw)
	}

	r = a.post("/v1/claim", `{"key":"order-1"}`)
	a.want(r, 409, "status", "in_progress")
	if ra, _ := strconv.Atoi(r.hdr.Get("Retry-After")); ra < 59 || ra > 60 {
		t.Fatalf("Retry-After %q, want the lease's ~60s", r.hdr.Get("Retry-After"))
	}

	a.want(a.post("/v1/extend", fmt.Sprintf(`{"key":"order-1","token":%d,"lease_ms":1000}`, tok)), 200, "status", "extended")
	a.want(a.post("/v1/complete", fmt.Sprintf(`{"key":"order-1","token":%d,"result":"{\"charge\":\"ch_1\"}"}`, tok)), 200, "status", "completed")
	// Repeating the completion with the same token is fine (a lost answer).
	a.want(a.post("/v1/complete", fmt.Sprintf(`{"key":"order-1","token":%d,"result":"other"}`, tok)), 200)

	r = a.post("/v1/claim", `{"key":"order-1"}`)
	a.want(r, 200, "status", "completed", "replayed", "true", "result", `{"charge":"ch_1"}`)

	r = a.do("GET", "/v1/records?key=order-1", "")
	a.want(r, 200, "key", "order-1", "state", "completed", "result", `{"charge":"ch_1"}`, "attempts", "1")
	if r.num("token") != tok {
		t.Fatalf("record token %d, want %d", r.num("token"), tok)
	}

	a.want(a.do("DELETE", "/v1/records?key=order-1", ""), 204)
	a.want(a.do("DELETE", "/v1/records?key=order-1", ""), 204) // absent: still 204
	a.want(a.do("GET", "/v1/records?key=order-1", ""), 404, "error", "not_found")

	r = a.post("/v1/claim", `{"key":"order-1"}`)
	a.want(r, 201, "status", "acquired")
	if r.num("token") <= tok {
		t.Fatalf("token after eviction %d, want > %d", r.num("token"), tok)
	}
}

func TestReleaseFailFence(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})

	tok := a.post("/v1/claim", `{"key":"k"}`).num("token")
	a.want(a.post("/v1/release", fmt.Sprintf(`{"key":"k","token":%d,"error":"gateway timeout"}`, tok)), 200, "status", "released")
	r := a.post("/v1/claim", `{"key":"k"}`)
	a.want(r, 201, "status", "acquired", "attempts", "2")
	tok2 := r.num("token")

	// The first holder's token is stale everywhere.
	for _, path := range []string{"/v1/complete", "/v1/release", "/v1/fail"} {
		a.want(a.post(path, fmt.Sprintf(`{"key":"k","token":%d}`, tok)), 409, "error", "fenced")
	}
	a.want(a.post("/v1/extend", fmt.Sprintf(`{"key":"k","token":%d,"lease_ms":100}`, tok)), 409, "error", "fenced")
	// Unknown keys are 404.
	a.want(a.post("/v1/complete", `{"key":"nobody","token":1}`), 404, "error", "not_found")

	a.want(a.post("/v1/fail", fmt.Sprintf(`{"key":"k","token":%d,"error":"card declined"}`, tok2)), 200, "status", "failed")
	a.want(a.post("/v1/claim", `{"key":"k"}`), 200, "status", "failed", "error", "card declined")
	a.want(a.do("GET", "/v1/records?key=k", ""), 200, "state", "failed", "last_error", "card declined")
}

func TestFingerprintMismatch(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})
	a.want(a.post("/v1/claim", `{"key":"k","fingerprint":"sha256:aa"}`), 201)
	a.want(a.post("/v1/claim", `{"key":"k","fingerprint":"sha256:bb"}`), 422, "error", "fingerprint_mismatch")
	a.want(a.post("/v1/claim", `{"key":"k","fingerprint_b64":"`+base64.StdEncoding.EncodeToString([]byte("sha256:aa"))+`"}`), 409, "status", "in_progress")
	a.want(a.do("GET", "/v1/records?key=k", ""), 200, "fingerprint", "sha256:aa")
}

// Keys are bytes: text (NUL included) as JSON strings, anything as base64,
// and the two spellings of the same bytes name the same record.
func TestKeyEncodings(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})
	bin := []byte{0xff, 0x00, 0xfe, 'k'}
	for _, tc := range []struct {
		name, claim, same, query string
		key                      []byte
	}{
		{"nul", `{"key":"a\u0000b"}`, `{"key_b64":"` + base64.StdEncoding.EncodeToString([]byte("a\x00b")) + `"}`, "key=a%00b", []byte("a\x00b")},
		{"unicode", `{"key":` + jsonStr("ключ-🔑") + `}`, `{"key":"\u043a\u043b\u044e\u0447-\ud83d\udd11"}`, "key=" + "%D0%BA%D0%BB%D1%8E%D1%87-%F0%9F%94%91", []byte("ключ-🔑")},
		{"binary", `{"key_b64":"` + base64.StdEncoding.EncodeToString(bin) + `"}`, `{"key_b64":"` + base64.StdEncoding.EncodeToString(bin) + `"}`, "key=%FF%00%FEk", bin},
		{"binary b64 query", `{"key_b64":"AQID"}`, `{"key_b64":"AQID"}`, "key_b64=AQID", []byte{1, 2, 3}},
		{"spaces", `{"key":"k "}`, `{"key":"k "}`, "key=k+", []byte("k ")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.want(a.post("/v1/claim", tc.claim), 201)
			a.want(a.post("/v1/claim", tc.same), 409)
			r := a.do("GET", "/v1/records?"+tc.query, "")
			a.want(r, 200, "state", "in_progress")
			got := []byte(r.str("key"))
			if r.m["key_b64"] != nil {
				got, _ = base64.StdEncoding.DecodeString(r.str("key_b64"))
			}
			if !bytes.Equal(got, tc.key) {
				t.Fatalf("record key %q, want %q (%s)", got, tc.key, r.raw)
			}
		})
	}
	// Case and trailing spaces are significant.
	a.want(a.post("/v1/claim", `{"key":"K "}`), 201)
	a.want(a.post("/v1/claim", `{"key":"k"}`), 201)

	// A result that is not text comes back as result_b64.
	tok := a.post("/v1/claim", `{"key":"bin-result"}`).num("token")
	a.want(a.post("/v1/complete", fmt.Sprintf(`{"key":"bin-result","token":%d,"result_b64":"/wA="}`, tok)), 200)
	r := a.post("/v1/claim", `{"key":"bin-result"}`)
	a.want(r, 200, "status", "completed", "result_b64", "/wA=")
	if _, ok := r.m["result"]; ok {
		t.Fatalf("binary result also given as text: %s", r.raw)
	}
	// An empty result is "" (present), not absent.
	tok = a.post("/v1/claim", `{"key":"empty-result"}`).num("token")
	a.want(a.post("/v1/complete", fmt.Sprintf(`{"key":"empty-result","token":%d}`, tok)), 200)
	a.want(a.post("/v1/claim", `{"key":"empty-result"}`), 200, "result", "")
}

// Every malformed request is a 400 with a JSON error, and none reaches the
// store: the store sees no call at all.
func TestBadInputNothingStored(t *testing.T) {
	long := strings.Repeat("x", idem.MaxKeyLen+1)
	for _, tc := range []struct {
		name, path, body, code string
	}{
		{"not json", "/v1/claim", `key=k`, "invalid_json"},
		{"empty body", "/v1/claim", ``, "invalid_json"},
		{"array", "/v1/claim", `["k"]`, "invalid_json"},
		{"string", "/v1/claim", `"k"`, "invalid_json"},
		{"truncated", "/v1/claim", `{"key":"k"`, "invalid_json"},
		{"trailing data", "/v1/claim", `{"key":"k"} {"key":"j"}`, "invalid_json"},
		{"trailing garbage", "/v1/claim", `{"key":"k"}x`, "invalid_json"},
		{"unknown field", "/v1/claim", `{"key":"k","lease":5}`, "invalid_request"},
		{"field in another case", "/v1/claim", `{"KEY":"k"}`, "invalid_request"},
		{"field twice", "/v1/claim", `{"key":"k","key":"j"}`, "invalid_request"},
		{"key and key_b64", "/v1/claim", `{"key":"k","key_b64":"aw=="}`, "invalid_request"},
		{"no key", "/v1/claim", `{"lease_ms":100}`, "invalid_key"},
		{"null key", "/v1/claim", `{"key":null}`, "invalid_key"},
		{"empty key", "/v1/claim", `{"key":""}`, "invalid_key"},
		{"empty key_b64", "/v1/claim", `{"key_b64":""}`, "invalid_key"},
		{"key too long", "/v1/claim", `{"key":"` + long + `"}`, "invalid_key"},
		{"key_b64 too long", "/v1/claim", `{"key_b64":"` + base64.StdEncoding.EncodeToString([]byte(long)) + `"}`, "invalid_key"},
		{"key number", "/v1/claim", `{"key":12}`, "invalid_request"},
		{"key object", "/v1/claim", `{"key":{"a":1}}`, "invalid_request"},
		{"key_b64 not base64", "/v1/claim", `{"key_b64":"***"}`, "invalid_request"},
		{"key_b64 unpadded", "/v1/claim", `{"key_b64":"YWJ"}`, "invalid_request"},
		{"invalid utf-8", "/v1/claim", "{\"key\":\"k\xff\"}", "invalid_json"},
		{"lone high surrogate", "/v1/claim", `{"key":"\ud800"}`, "invalid_json"},
		{"lone low surrogate", "/v1/claim", `{"key":"a\udc00"}`, "invalid_json"},
		{"high surrogate then text", "/v1/claim", `{"key":"\ud800\u0041"}`, "invalid_json"},
		{"negative lease", "/v1/claim", `{"key":"k","lease_ms":-1}`, "invalid_request"},
		{"zero lease", "/v1/claim", `{"key":"k","lease_ms":0}`, "invalid_request"},
		{"fractional lease", "/v1/claim", `{"key":"k","lease_ms":1.5}`, "invalid_request"},
		{"exponent lease", "/v1/claim", `{"key":"k","lease_ms":1e3}`, "invalid_request"},
		{"huge lease", "/v1/claim", `{"key":"k","lease_ms":1e400}`, "invalid_request"},
		{"lease over max", "/v1/claim", `{"key":"k","lease_ms":` + strconv.FormatInt(int64(idem.MaxLease/time.Millisecond)+1, 10) + `}`, "invalid_request"},
		{"lease overflow", "/v1/claim", `{"key":"k","lease_ms":9223372036854775807}`, "invalid_request"},
		{"lease string", "/v1/claim", `{"key":"k","lease_ms":"soon"}`, "invalid_request"},
		{"lease bool", "/v1/claim", `{"key":"k","lease_ms":true}`, "invalid_request"},
		{"ttl over max", "/v1/claim", `{"key":"k","ttl_ms":` + strconv.FormatInt(int64(idem.MaxTTL/time.Millisecond)+1, 10) + `}`, "invalid_request"},
		{"fingerprint too long", "/v1/claim", `{"key":"k","fingerprint":"` + strings.Repeat("f", idem.MaxFingerprintLen+1) + `"}`, "invalid_request"},
		{"batch empty", "/v1/claim/batch", `{"claims":[]}`, "invalid_request"},
		{"batch missing", "/v1/claim/batch", `{}`, "invalid_request"},
		{"batch not array", "/v1/claim/batch", `{"claims":{"key":"k"}}`, "invalid_request"},
		{"batch one bad entry", "/v1/claim/batch", `{"claims":[{"key":"k"},{"key":""}]}`, "invalid_key"},
		{"batch bad entry last", "/v1/claim/batch", `{"claims":[{"key":"k"},{"key":"j","lease_ms":-5}]}`, "invalid_request"},
		{"batch unknown field", "/v1/claim/batch", `{"claims":[{"key":"k"}],"x":1}`, "invalid_request"},
		{"complete no token", "/v1/complete", `{"key":"k"}`, "invalid_request"},
		{"complete token 0", "/v1/complete", `{"key":"k","token":0}`, "invalid_request"},
		{"complete token negative", "/v1/complete", `{"key":"k","token":-3}`, "invalid_request"},
		{"complete token fraction", "/v1/complete", `{"key":"k","token":1.5}`, "invalid_request"},
		{"complete token 2^64", "/v1/complete", `{"key":"k","token":18446744073709551616}`, "invalid_request"},
		{"complete lease field", "/v1/complete", `{"key":"k","token":1,"lease_ms":5}`, "invalid_request"},
		{"complete result too long", "/v1/complete", `{"key":"k","token":1,"result":"` + strings.Repeat("r", idem.MaxResultLen+1) + `"}`, "invalid_request"},
		{"release result field", "/v1/release", `{"key":"k","token":1,"result":"x"}`, "invalid_request"},
		{"fail cause too long", "/v1/fail", `{"key":"k","token":1,"error":"` + strings.Repeat("e", idem.MaxCauseLen+1) + `"}`, "invalid_request"},
		{"extend without lease", "/v1/extend", `{"key":"k","token":1}`, "invalid_request"},
		{"extend zero lease", "/v1/extend", `{"key":"k","token":1,"lease_ms":0}`, "invalid_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := faultstore.New(newMem(t))
			a := newAPI(t, httpapi.Config{Store: fs.WithBatch()})
			r := a.post(tc.path, tc.body)
			a.want(r, 400, "error", tc.code)
			if r.str("detail") == "" {
				t.Fatalf("no detail: %s", r.raw)
			}
			for _, op := range []faultstore.Op{faultstore.OpClaim, faultstore.OpBatch, faultstore.OpComplete, faultstore.OpRelease, faultstore.OpFail, faultstore.OpExtend} {
				if n := fs.Calls(op); n != 0 {
					t.Fatalf("store saw %d %s calls for a bad request", n, op)
				}
			}
		})
	}
}

func TestBadQuery(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})
	for _, q := range []string{"", "?", "?key=", "?k=v", "?key=a&key=b", "?key=a&key_b64=YQ==", "?key_b64=***", "?key=%zz", "?key=" + strings.Repeat("x", idem.MaxKeyLen+1)} {
		for _, m := range []string{"GET", "DELETE"} {
			r := a.do(m, "/v1/records"+q, "")
			if r.code != 400 || r.str("error") == "" {
				t.Errorf("%s /v1/records%s: %d %s, want 400", m, q, r.code, r.raw)
			}
		}
	}
}

func TestBodyLimit(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t), MaxBodyBytes: 100})
	body := `{"key":"` + strings.Repeat("k", 200) + `"}`
	a.want(a.post("/v1/claim", body), 413, "error", "body_too_large")

	// Without a Content-Length (chunked), the limit is found while reading.
	req, _ := http.NewRequest("POST", a.srv.URL+"/v1/claim", io.MultiReader(strings.NewReader(body)))
	req.ContentLength = -1
	resp, err := a.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("chunked: %d, want 413", resp.StatusCode)
	}
	a.want(a.post("/v1/claim", `{"key":"small"}`), 201)
}

func TestRoutesAndMethods(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})
	r := a.do("GET", "/v1/claim", "")
	a.want(r, 405, "error", "method_not_allowed")
	if r.hdr.Get("Allow") != "POST" {
		t.Fatalf("Allow %q", r.hdr.Get("Allow"))
	}
	a.want(a.do("PUT", "/v1/records?key=k", ""), 405)
	a.want(a.do("POST", "/healthz", ""), 405)
	a.want(a.do("GET", "/v2/claim", ""), 404, "error", "not_found")
	a.want(a.do("GET", "/", ""), 404)
	a.want(a.do("GET", "/healthz", ""), 200, "status", "ok")
	a.want(a.do("GET", "/readyz", ""), 200, "status", "ready")

	dash := newAPI(t, httpapi.Config{Store: newMem(t), Dashboard: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "dashboard "+r.URL.Path)
	})})
	if r := dash.do("GET", "/", ""); r.code != 200 || r.raw != "dashboard /" {
		t.Fatalf("dashboard: %d %q", r.code, r.raw)
	}
	dash.want(dash.do("GET", "/healthz", ""), 200, "status", "ok")
}

// Tokens bind requests to namespaces: a namespace never sees, completes or
// evicts another's keys.
func TestAuthNamespaces(t *testing.T) {
	root := newMem(t)
	nsA, _ := root.Namespace("tenant-a")
	nsB, _ := root.Namespace("tenant-b")
	const tokA, tokB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	a := newAPI(t, httpapi.Config{Tokens: []httpapi.Token{
		{Namespace: "tenant-a", Secret: tokA, Store: nsA},
		{Namespace: "tenant-b", Secret: tokB, Store: nsB},
	}})

	for _, tc := range []struct{ name, auth string }{
		{"none", ""},
		{"wrong", "Bearer token-c-0123456789abcdef"},
		{"prefix", "Bearer " + tokA[:len(tokA)-1]},
		{"longer", "Bearer " + tokA + "x"},
		{"basic", "Basic " + tokA},
		{"bare", tokA},
	} {
		req, _ := http.NewRequest("POST", a.srv.URL+"/v1/claim", strings.NewReader(`{"key":"k"}`))
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := a.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d, want 401 with WWW-Authenticate", tc.name, resp.StatusCode)
		}
	}
	if n, _ := root.Stats(context.Background()); n.Total() != 0 {
		t.Fatalf("unauthorized requests stored %d records", n.Total())
	}
	for _, m := range []string{"GET", "DELETE"} {
		a.want(a.do(m, "/v1/records?key=k", ""), 401)
	}

	A, B := a.as(tokA), a.as(tokB)
	r := A.post("/v1/claim", `{"key":"k"}`)
	A.want(r, 201)
	tokenA := r.num("token")
	B.want(B.do("GET", "/v1/records?key=k", ""), 404)                                  // cannot see it
	B.want(B.post("/v1/complete", fmt.Sprintf(`{"key":"k","token":%d}`, tokenA)), 404) // cannot complete it
	B.want(B.post("/v1/fail", fmt.Sprintf(`{"key":"k","token":%d}`, tokenA)), 404)
	B.want(B.do("DELETE", "/v1/records?key=k", ""), 204) // evicts nothing of A's
	B.want(B.post("/v1/claim", `{"key":"k"}`), 201)      // its own k
	A.want(A.do("GET", "/v1/records?key=k", ""), 200, "state", "in_progress")
	A.want(A.post("/v1/claim", `{"key":"k"}`), 409)
	A.want(A.post("/v1/complete", fmt.Sprintf(`{"key":"k","token":%d}`, tokenA)), 200)

	// Health and readiness need no token (they carry no key).
	a.want(a.do("GET", "/healthz", ""), 200)
	a.want(a.do("GET", "/readyz", ""), 200)
}

func TestConfigValidate(t *testing.T) {
	s := newMem(t)
	for _, tc := range []struct {
		name string
		cfg  httpapi.Config
	}{
		{"no store", httpapi.Config{}},
		{"short token", httpapi.Config{Tokens: []httpapi.Token{{Secret: "short", Store: s}}}},
		{"token with space", httpapi.Config{Tokens: []httpapi.Token{{Secret: "0123456789abcdef 0123", Store: s}}}},
		{"token twice", httpapi.Config{Tokens: []httpapi.Token{{Secret: "0123456789abcdef", Store: s}, {Namespace: "b", Secret: "0123456789abcdef", Store: s}}}},
		{"token without store", httpapi.Config{Tokens: []httpapi.Token{{Secret: "0123456789abcdef"}}}},
		{"bad namespace", httpapi.Config{Tokens: []httpapi.Token{{Namespace: "a:b", Secret: "0123456789abcdef", Store: s}}}},
		{"bad lease", httpapi.Config{Store: s, Lease: -time.Second}},
		{"bad ttl", httpapi.Config{Store: s, TTL: time.Nanosecond}},
		{"negative body", httpapi.Config{Store: s, MaxBodyBytes: -1}},
		{"batch too big", httpapi.Config{Store: s, MaxBatch: 1 << 20}},
	} {
		if _, err := httpapi.New(tc.cfg); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
}

// A batch is one store round trip, answered in order; a key twice in one
// batch is acquired by its first entry.
func TestBatchOneRoundTrip(t *testing.T) {
	fs := faultstore.New(newMem(t))
	a := newAPI(t, httpapi.Config{Store: fs.WithBatch()})
	a.want(a.post("/v1/claim", `{"key":"done","fingerprint":"f1"}`), 201)
	rec := a.do("GET", "/v1/records?key=done", "")
	a.want(a.post("/v1/complete", fmt.Sprintf(`{"key":"done","token":%d,"result":"r"}`, rec.num("token"))), 200)
	claims0 := fs.Calls(faultstore.OpClaim)

	r := a.post("/v1/claim/batch", `{"claims":[{"key":"a"},{"key":"b","lease_ms":5000},{"key":"a"},{"key":"done"},{"key":"done","fingerprint":"f2"}]}`)
	a.want(r, 200)
	var got []string
	for _, e := range r.m["results"].([]any) {
		m := e.(map[string]any)
		got = append(got, fmt.Sprint(m["status"], "/", m["error"], "/", m["result"]))
	}
	want := []string{"acquired/<nil>/<nil>", "acquired/<nil>/<nil>", "in_progress/<nil>/<nil>", "completed/<nil>/r", "<nil>/fingerprint_mismatch/<nil>"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("results %v, want %v", got, want)
	}
	if n := fs.Calls(faultstore.OpBatch); n != 1 {
		t.Fatalf("%d ClaimBatch calls, want 1", n)
	}
	if n := fs.Calls(faultstore.OpClaim) - claims0; n != 0 {
		t.Fatalf("%d single claims during the batch, want 0", n)
	}

	// Over the entry limit: 400, nothing claimed.
	small := newAPI(t, httpapi.Config{Store: newMem(t), MaxBatch: 2})
	small.want(small.post("/v1/claim/batch", `{"claims":[{"key":"x"},{"key":"y"},{"key":"z"}]}`), 400)
	small.want(small.do("GET", "/v1/records?key=x", ""), 404)
}

// Store trouble is 503 with Retry-After and a code saying what is known;
// it never looks like bad input.
func TestStoreErrors(t *testing.T) {
	fs := faultstore.New(newMem(t))
	a := newAPI(t, httpapi.Config{Store: fs.WithBatch(), StoreTimeout: 50 * time.Millisecond})

	fs.SetDown(true)
	r := a.post("/v1/claim", `{"key":"k"}`)
	a.want(r, 503, "error", "store_unavailable")
	if r.hdr.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	a.want(a.post("/v1/claim/batch", `{"claims":[{"key":"k"}]}`), 503, "error", "store_unavailable")
	fs.SetDown(false)

	fs.Inject(faultstore.OpClaim, faultstore.Fault{Err: idem.ErrUnknownOutcome, Applied: true, Times: 1})
	a.want(a.post("/v1/claim", `{"key":"k"}`), 503, "error", "unknown_outcome")
	// It was applied: the retry finds the key held.
	a.want(a.post("/v1/claim", `{"key":"k"}`), 409, "status", "in_progress")

	fs.Inject(faultstore.OpGet, faultstore.Fault{Delay: time.Second, Times: 1})
	a.want(a.do("GET", "/v1/records?key=k", ""), 503, "error", "store_timeout")

	fs.Inject(faultstore.OpClaim, faultstore.Fault{Err: fmt.Errorf("%w: bad bytes", idem.ErrCorrupt), Times: 1})
	a.want(a.post("/v1/claim", `{"key":"k"}`), 500, "error", "corrupt_record")
}

type pingStore struct {
	idem.Store
	err error
}

func (p pingStore) Ping(context.Context) error { return p.err }

func TestReadyAndDrain(t *testing.T) {
	ps := &pingStore{Store: newMem(t)}
	a := newAPI(t, httpapi.Config{Store: ps})
	a.want(a.do("GET", "/readyz", ""), 200, "status", "ready")
	ps.err = fmt.Errorf("%w: connection refused", idem.ErrUnavailable)
	a.want(a.do("GET", "/readyz", ""), 503, "status", "unavailable")
	a.want(a.do("GET", "/healthz", ""), 200, "status", "ok")
	ps.err = nil
	a.h.Drain()
	a.want(a.do("GET", "/readyz", ""), 503, "status", "draining")
	a.want(a.post("/v1/claim", `{"key":"still served"}`), 201)
}

func TestMetrics(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})
	a.post("/v1/claim", `{"key":"k"}`)
	a.post("/v1/claim", `{"key":"k"}`)
	a.post("/v1/claim", `{"key":""}`)
	a.post("/v1/claim/batch", `{"claims":[{"key":"x"},{"key":"y"}]}`)
	r := a.do("GET", "/metrics", "")
	if r.code != 200 || !strings.HasPrefix(r.hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("%d %s", r.code, r.hdr.Get("Content-Type"))
	}
	for _, line := range []string{
		`idem_http_requests_total{route="claim",code="201"} 1`,
		`idem_http_requests_total{route="claim",code="409"} 1`,
		`idem_http_requests_total{route="claim",code="400"} 1`,
		`idem_http_claims_total{outcome="acquired"} 3`,
		`idem_http_claims_total{outcome="in_progress"} 1`,
		`idem_http_request_duration_seconds_count{route="claim"} 3`,
		`idem_http_request_duration_seconds_bucket{route="claim",le="+Inf"} 3`,
		`# TYPE idem_http_in_flight_requests gauge`,
	} {
		if !strings.Contains(r.raw, line+"\n") {
			t.Errorf("metrics lack %q:\n%s", line, r.raw)
		}
	}

	custom := newAPI(t, httpapi.Config{Store: newMem(t), Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "custom 1\n")
	})})
	if r := custom.do("GET", "/metrics", ""); r.raw != "custom 1\n" {
		t.Fatalf("custom metrics handler not used: %q", r.raw)
	}
}

// Many clients racing for the same keys through HTTP: one acquisition per
// key.
func TestClaimStorm(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: newMem(t)})
	const keys, clients = 50, 8
	var mu sync.Mutex
	acquired := map[string]int{}
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < keys; k++ {
				key := fmt.Sprintf("storm-%d", k)
				req, _ := http.NewRequest("POST", a.srv.URL+"/v1/claim", strings.NewReader(`{"key":"`+key+`"}`))
				resp, err := a.srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 201:
					mu.Lock()
					acquired[key]++
					mu.Unlock()
				case 409:
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	for k := 0; k < keys; k++ {
		if n := acquired[fmt.Sprintf("storm-%d", k)]; n != 1 {
			t.Errorf("storm-%d acquired %d times", k, n)
		}
	}
}

// skewedClock is a store's clock off the service's by a fixed amount.
type skewedClock time.Duration

func (c skewedClock) Now() time.Time { return time.Now().Add(time.Duration(c)) }

// The lease end is on the store's clock: Retry-After must stay within the
// holder's lease span whatever the skew between store and service (a store
// 10 h ahead gave "Retry-After: 36060"), and at least 1 second.
func TestRetryAfterRobustToClockSkew(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration
	}{{"store ahead", 10 * time.Hour}, {"store behind", -10 * time.Hour}, {"in step", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := memstore.New(memstore.Config{Clock: skewedClock(tc.skew)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			a := newAPI(t, httpapi.Config{Store: s})
			a.want(a.post("/v1/claim", `{"key":"k","lease_ms":60000}`), 201, "status", "acquired")
			r := a.post("/v1/claim", `{"key":"k"}`)
			a.want(r, 409, "status", "in_progress")
			ra, err := strconv.Atoi(r.hdr.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 60 {
				t.Fatalf("Retry-After %q, want 1..60 (the holder's 60 s lease)", r.hdr.Get("Retry-After"))
			}
			if tc.skew == 0 && ra < 59 {
				t.Fatalf("Retry-After %d, want the lease's ~60s", ra)
			}
		})
	}
}
