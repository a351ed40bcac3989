package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestServeMetrics: /metrics of idem serve has the HTTP API's counters,
// the records of every served namespace by state (summed: no label names a
// namespace, since /metrics needs no token) and the Go runtime's metrics,
// and passes promlint.
func TestServeMetrics(t *testing.T) {
	const tokA, tokB, tokA2 = "token-of-tenant-a-0001", "token-of-tenant-b-0002", "token-of-tenant-a-0003"
	s := start(t, "serve", "--store", "memory://", "--addr", "127.0.0.1:0", "--log-level", "warn",
		"--auth-token", "tenant-a:"+tokA, "--auth-token", "tenant-b:"+tokB, "--auth-token", "tenant-a:"+tokA2)
	for _, tok := range []string{tokA, tokB} {
		r := call(t, "POST", s.url+"/v1/claim", tok, `{"key":"order-1"}`)
		if r.code != 201 {
			t.Fatalf("claim: %d %s", r.code, r.body)
		}
		if r := call(t, "POST", s.url+"/v1/complete", tok, fmt.Sprintf(`{"key":"order-1","token":%v}`, r.m["token"])); r.code != 200 {
			t.Fatalf("complete: %d %s", r.code, r.body)
		}
	}
	if r := call(t, "POST", s.url+"/v1/claim", tokA, `{"key":"order-1"}`); r.code != 200 {
		t.Fatalf("replay: %d %s", r.code, r.body)
	}
	r := call(t, "GET", s.url+"/metrics", "", "")
	if r.code != 200 {
		t.Fatalf("/metrics: %d %s", r.code, r.body)
	}
	for _, want := range []string{
		`idem_http_claims_total{outcome="acquired"} 2`,
		`idem_http_claims_total{outcome="completed"} 1`,
		`idem_records{state="completed"} 2`, // one per namespace, tenant-a's handle counted once
		`idem_records{state="in_progress"} 0`,
		"go_goroutines ",
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(r.body, "tenant-") || strings.Contains(r.body, "order-1") {
		t.Error("/metrics names a namespace or a key")
	}
	problems, err := promlint.New(strings.NewReader(r.body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "idem_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}
