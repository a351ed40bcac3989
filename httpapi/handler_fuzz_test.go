package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem/faultstore"
	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/memstore"
)

var fuzzPaths = []string{"/v1/claim", "/v1/claim/batch", "/v1/complete", "/v1/release", "/v1/fail", "/v1/extend"}

// FuzzHandler posts arbitrary bodies to every endpoint: the answer is
// never a 5xx (the store is healthy, so only input decides), always JSON,
// and a 400 or 413 leaves the store uncalled.
func FuzzHandler(f *testing.F) {
	for i := range fuzzPaths {
		for _, s := range []string{`{"key":"k"}`, `{"key":"k","token":1}`, `{"key":"k","token":1,"lease_ms":10}`,
			`{"claims":[{"key":"k"},{"key":"k","fingerprint":"x"}]}`, `{"key":"k","fingerprint":"a"}`, `{`, "\xff"} {
			f.Add(uint8(i), s)
		}
	}
	mem, err := memstore.New(memstore.Config{})
	if err != nil {
		f.Fatal(err)
	}
	defer mem.Close()
	fs := faultstore.New(mem)
	h, err := httpapi.New(httpapi.Config{Store: fs.WithBatch(), MaxBodyBytes: 1 << 16, MaxBatch: 16})
	if err != nil {
		f.Fatal(err)
	}
	calls := func() (n int) {
		for _, op := range []faultstore.Op{faultstore.OpClaim, faultstore.OpBatch, faultstore.OpComplete, faultstore.OpRelease, faultstore.OpFail, faultstore.OpExtend} {
			n += fs.Calls(op)
		}
		return n
	}
	f.Fuzz(func(t *testing.T, path uint8, body string) {
		before := calls()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", fuzzPaths[int(path)%len(fuzzPaths)], strings.NewReader(body)))
		if w.Code >= 500 {
			t.Fatalf("%d for body %q: %s", w.Code, body, w.Body)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q", ct)
		}
		if (w.Code == http.StatusBadRequest || w.Code == http.StatusRequestEntityTooLarge) && calls() != before {
			t.Fatalf("%d, yet the store was called: %q", w.Code, body)
		}
	})
}
