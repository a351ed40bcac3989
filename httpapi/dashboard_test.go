package httpapi_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/httpapi"
)

// dashStats is the part of GET /v1/stats the tests read.
type dashStats struct {
	DuplicateRate float64          `json:"duplicate_rate"`
	Totals        map[string]int64 `json:"totals"`
	Series        []struct {
		T        int64 `json:"t"`
		Claims   int64 `json:"claims"`
		Replayed int64 `json:"replayed"`
		Requests int64 `json:"requests"`
	} `json:"series"`
	Latency struct {
		P50 float64 `json:"p50_ms"`
		P99 float64 `json:"p99_ms"`
	} `json:"latency"`
	Records *struct {
		InProgress int64 `json:"in_progress"`
		Completed  int64 `json:"completed"`
		Failed     int64 `json:"failed"`
		Released   int64 `json:"released"`
	} `json:"records"`
}

type dashRecent struct {
	InProgress []struct {
		Key   string `json:"key"`
		Token uint64 `json:"token"`
	} `json:"in_progress"`
	Failures []struct {
		Key   string `json:"key"`
		Kind  string `json:"kind"`
		Error string `json:"error"`
	} `json:"failures"`
}

func decodeInto(t *testing.T, r reply, v any) {
	t.Helper()
	if r.code != 200 {
		t.Fatalf("status %d: %s", r.code, r.raw)
	}
	if err := json.Unmarshal([]byte(r.raw), v); err != nil {
		t.Fatalf("%v: %s", err, r.raw)
	}
}

// TestDashboardEndpoints: /v1/stats and /v1/recent count what the token's
// namespace did (claims by outcome, replays, requests, records by state,
// keys in progress, releases with an error and fails) and nothing of the
// other namespace's; they need the token like the rest of /v1.
func TestDashboardEndpoints(t *testing.T) {
	root := newMem(t)
	nsA, _ := root.Namespace("tenant-a")
	nsB, _ := root.Namespace("tenant-b")
	const tokA, tokB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	srv := newAPI(t, httpapi.Config{Tokens: []httpapi.Token{
		{Namespace: "tenant-a", Secret: tokA, Store: nsA},
		{Namespace: "tenant-b", Secret: tokB, Store: nsB},
	}})
	a, b := srv.as(tokA), srv.as(tokB)

	// tenant-a: 3 keys done, each claimed again twice (6 replays); one
	// released with an error, one failed, one held.
	for i := range 3 {
		r := a.post("/v1/claim", fmt.Sprintf(`{"key":"done-%d"}`, i))
		a.want(r, 201)
		a.want(a.post("/v1/complete", fmt.Sprintf(`{"key":"done-%d","token":%d,"result":"ok"}`, i, r.num("token"))), 200)
		for range 2 {
			a.want(a.post("/v1/claim", fmt.Sprintf(`{"key":"done-%d"}`, i)), 200, "replayed", "true")
		}
	}
	r := a.post("/v1/claim", `{"key":"flaky"}`)
	a.want(a.post("/v1/release", fmt.Sprintf(`{"key":"flaky","token":%d,"error":"timeout calling the bank"}`, r.num("token"))), 200)
	r = a.post("/v1/claim", `{"key":"poison"}`)
	a.want(a.post("/v1/fail", fmt.Sprintf(`{"key":"poison","token":%d,"error":"card declined"}`, r.num("token"))), 200)
	r = a.post("/v1/claim", `{"key":"held","lease_ms":60000}`)
	a.want(r, 201)
	a.want(a.post("/v1/claim", `{"key":"held"}`), 409)
	// A release without an error is not a failure.
	r = a.post("/v1/claim", `{"key":"given-back"}`)
	a.want(a.post("/v1/release", fmt.Sprintf(`{"key":"given-back","token":%d}`, r.num("token"))), 200)

	var st dashStats
	decodeInto(t, a.do("GET", "/v1/stats", ""), &st)
	want := map[string]int64{"acquired": 7, "completed": 6, "in_progress": 1, "failed": 0, "fingerprint_mismatch": 0, "error": 0}
	for k, v := range want {
		if st.Totals[k] != v {
			t.Errorf("totals[%s] = %d, want %d (%v)", k, st.Totals[k], v, st.Totals)
		}
	}
	if len(st.Series) != 60 {
		t.Fatalf("%d points, want 60", len(st.Series))
	}
	var claims, replayed, requests int64
	for i, p := range st.Series {
		claims, replayed, requests = claims+p.Claims, replayed+p.Replayed, requests+p.Requests
		if i > 0 && p.T != st.Series[i-1].T+1 {
			t.Fatalf("series not one point per second: %v", st.Series)
		}
	}
	// 14 claims, 6 of them replays; 14 claims + 3 completes + 3 releases/fails.
	if claims != 14 || replayed != 6 || requests != 20 {
		t.Errorf("series: claims %d replayed %d requests %d; want 14 6 20", claims, replayed, requests)
	}
	if st.Records == nil || st.Records.InProgress != 1 || st.Records.Completed != 3 || st.Records.Failed != 1 || st.Records.Released != 2 {
		t.Errorf("records %+v, want 1 in progress, 3 completed, 1 failed, 2 released", st.Records)
	}

	var rc dashRecent
	decodeInto(t, a.do("GET", "/v1/recent", ""), &rc)
	if len(rc.InProgress) != 1 || rc.InProgress[0].Key != "held" {
		t.Errorf("in progress %+v, want [held]", rc.InProgress)
	}
	if len(rc.Failures) != 2 || rc.Failures[0].Key != "poison" || rc.Failures[0].Kind != "failed" || rc.Failures[0].Error != "card declined" ||
		rc.Failures[1].Key != "flaky" || rc.Failures[1].Kind != "released" || rc.Failures[1].Error != "timeout calling the bank" {
		t.Errorf("failures %+v, want poison (failed), then flaky (released)", rc.Failures)
	}

	// tenant-b sees none of it.
	decodeInto(t, b.do("GET", "/v1/stats", ""), &st)
	for k, v := range st.Totals {
		if v != 0 {
			t.Errorf("tenant-b totals[%s] = %d", k, v)
		}
	}
	if st.Records == nil || st.Records.InProgress+st.Records.Completed+st.Records.Failed+st.Records.Released != 0 {
		t.Errorf("tenant-b records %+v", st.Records)
	}
	rc = dashRecent{}
	decodeInto(t, b.do("GET", "/v1/recent", ""), &rc)
	if len(rc.InProgress) != 0 || len(rc.Failures) != 0 {
		t.Errorf("tenant-b recent %+v", rc)
	}

	// The token is required; only GET and HEAD.
	for _, path := range []string{"/v1/stats", "/v1/recent"} {
		srv.want(srv.do("GET", path, ""), 401)
		a.want(a.do("POST", path, "{}"), 405)
		a.want(a.do("HEAD", path, ""), 200)
	}
}

// TestDashboardWithoutAuth: without tokens the endpoints answer about the
// one served namespace, and a store that cannot count or list says null.
func TestDashboardWithoutAuth(t *testing.T) {
	a := newAPI(t, httpapi.Config{Store: plainStore{newMem(t)}})
	r := a.post("/v1/claim", `{"key":"k"}`)
	a.want(r, 201)
	var st dashStats
	decodeInto(t, a.do("GET", "/v1/stats", ""), &st)
	if st.Totals["acquired"] != 1 || st.Records != nil {
		t.Errorf("totals %v records %v; want 1 acquired, no records", st.Totals, st.Records)
	}
	r = a.do("GET", "/v1/recent", "")
	a.want(r, 200)
	if r.m["in_progress"] != nil {
		t.Errorf("in_progress %v on a store that cannot list", r.m["in_progress"])
	}
}

// plainStore hides every optional capability of the store it wraps.
type plainStore struct{ idem.Store }
