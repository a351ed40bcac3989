package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/memstore"
)

// BenchmarkHandlerClaim is the API's own cost per claim, without a network
// or an HTTP server (decode, memstore claim, answer, counters), beside a
// handler that only reads the body: the difference is the API's.
// cmd/idem's BenchmarkHTTPClaims measures it over HTTP.
func BenchmarkHandlerClaim(b *testing.B) {
	s, _ := memstore.New(memstore.Config{MaxEntries: 1 << 30})
	defer s.Close()
	h, _ := httpapi.New(httpapi.Config{Store: s})
	b.Run("api", func(b *testing.B) { benchHandler(b, h, 201) })
	b.Run("read-body-only", func(b *testing.B) {
		benchHandler(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }), 200)
	})
}

var benchKeys atomic.Int64

func benchHandler(b *testing.B, h http.Handler, want int) {
	bodies := make([]string, 1024)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%len(bodies) == 0 { // every key new; bodies built 1024 at a time
			for j := range bodies {
				bodies[j] = `{"key":"k` + strconv.FormatInt(benchKeys.Add(1), 10) + `","lease_ms":30000}`
			}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/claim", strings.NewReader(bodies[i%len(bodies)])))
		if w.Code != want {
			b.Fatal(w.Code, w.Body)
		}
	}
}
