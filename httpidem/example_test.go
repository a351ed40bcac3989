package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem/httpidem"
	"github.com/idem-dev/idem/memstore"
)

// The middleware in front of a payment handler: a retried POST with the
// same Idempotency-Key gets the first answer back instead of a second
// charge.
func ExampleMiddleware() {
	store, _ := memstore.New(memstore.Config{Namespace: "payments"})
	defer store.Close()
	mw, _ := httpidem.New(httpidem.Config{Store: store, RequireKey: []string{"/charges"}})
	defer mw.Close()

	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch_%d"}`, charges)
	})
	srv := httptest.NewServer(mw.Handler(charge))
	defer srv.Close()

	post := func(key string) {
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"amount":1000}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	}
	post(`"9c1d6f3e-2c1b-4a57-9d0e-1f2a3b4c5d6e"`)
	post(`"9c1d6f3e-2c1b-4a57-9d0e-1f2a3b4c5d6e"`) // a retry: replayed
	post("")                                       // no key on a route that requires one
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"charge":"ch_1"}
	// 201 true {"charge":"ch_1"}
	// 400  {"type":"https://github.com/idem-dev/idem/blob/main/docs/http.md#key-missing","title":"Idempotency-Key missing","status":400,"detail":"Idempotency-Key is required on this route"}
	// charges: 1
}
