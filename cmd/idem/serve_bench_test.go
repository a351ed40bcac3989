package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/redisstore"
)

// BenchmarkHTTPClaims: new-key claims per second over HTTP/1.1 keep-alive
// on memstore and Redis, beside the same store called in process and a
// bare net/http handler that reads the body and answers a constant (the
// HTTP stack's own ceiling), all in one run:
//
//	cd cmd/idem && flock /tmp/bench.lock go test -run '^$' -bench HTTPClaims -benchtime 2s -count 5 . | tee httpapi.txt
//
// clients is the number of concurrent callers (GOMAXPROCS x parallelism);
// batch100 sends 100 claims per /v1/claim/batch (and per ClaimBatch in
// process). The claims/s metric counts claims, not requests.
func BenchmarkHTTPClaims(b *testing.B) {
	for _, st := range []struct {
		name string
		open func(b *testing.B) idem.Store
	}{
		{"memstore", func(b *testing.B) idem.Store {
			s, err := memstore.New(memstore.Config{MaxEntries: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
		{"redis", func(b *testing.B) idem.Store {
			c, err := redisstore.FromURL(redisURL(b))
			if err != nil {
				b.Fatal(err)
			}
			s, err := c.Open(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
	} {
		for _, par := range []int{1, 8} {
			for _, batch := range []int{1, 100} {
				shape := fmt.Sprintf("clients=%dxcores/batch=%d", par, batch)
				for _, mode := range []string{"bare-http", "inprocess", "http"} {
					if mode == "bare-http" && st.name != "memstore" {
						continue // the bare handler touches no store
					}
					b.Run(st.name+"/"+shape+"/"+mode, func(b *testing.B) {
						benchClaims(b, st.open(b), mode, par, batch)
					})
				}
			}
		}
	}
}

var benchRun atomic.Int64 // makes every key of every sub-benchmark new

func benchClaims(b *testing.B, store idem.Store, mode string, par, batch int) {
	prefix := "b" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
	var seq atomic.Int64
	ctx := context.Background()
	var url string
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}}
	defer client.CloseIdleConnections()
	switch mode {
	case "http":
		h, err := httpapi.New(httpapi.Config{Store: store, Lease: time.Minute, TTL: 10 * time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(h)
		defer srv.Close()
		url = srv.URL
	case "bare-http":
		answer := []byte(`{"status":"acquired","token":1}` + "\n")
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Write(answer)
		}))
		defer srv.Close()
		url = srv.URL
	}
	path := "/v1/claim"
	if batch > 1 {
		path = "/v1/claim/batch"
	}
	b.SetParallelism(par)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var body bytes.Buffer
		reqs := make([]idem.ClaimRequest, batch)
		for pb.Next() {
			first := seq.Add(int64(batch)) - int64(batch)
			if mode == "inprocess" {
				for i := range reqs {
					reqs[i] = idem.ClaimRequest{Key: []byte(prefix + strconv.FormatInt(first+int64(i), 10)), Lease: time.Minute, TTL: 10 * time.Minute}
				}
				if batch == 1 {
					c, err := store.Claim(ctx, reqs[0])
					if err != nil || c.Outcome != idem.OutcomeAcquired {
						b.Fatalf("claim: %v %v", c.Outcome, err)
					}
					continue
				}
				res, err := store.(idem.BatchClaimer).ClaimBatch(ctx, reqs)
				if err != nil || res[0].Claim.Outcome != idem.OutcomeAcquired {
					b.Fatalf("batch: %v", err)
				}
				continue
			}
			body.Reset()
			if batch > 1 {
				body.WriteString(`{"claims":[`)
			}
			for i := range batch {
				if i > 0 {
					body.WriteByte(',')
				}
				fmt.Fprintf(&body, `{"key":"%s%d"}`, prefix, first+int64(i))
			}
			if batch > 1 {
				body.WriteString(`]}`)
			}
			resp, err := client.Post(url+path, "application/json", &body)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if want := map[bool]int{true: 201, false: 200}[batch == 1 && mode == "http"]; resp.StatusCode != want {
				b.Fatalf("status %d, want %d", resp.StatusCode, want)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "claims/s")
}
