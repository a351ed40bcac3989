package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/memstore"
)

// The HTTP API over a store: what a worker written in any language does to
// process a message once.
func ExampleNew() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	h, _ := httpapi.New(httpapi.Config{Store: store})
	srv := httptest.NewServer(h)
	defer srv.Close()

	post := func(path, body string) string {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprint(resp.StatusCode, " ", strings.TrimSpace(string(b)))
	}
	// The first delivery claims the key; the token comes with it.
	first := post("/v1/claim", `{"key":"msg-1","lease_ms":30000}`)
	fmt.Println(first[:len(`201 {"status":"acquired"`)])
	// A duplicate while it runs is told to come back later.
	fmt.Println(post("/v1/claim", `{"key":"msg-1"}`)[:len(`409 {"status":"in_progress"`)])
	// The worker records its result with its token (the first token a new
	// store issues is 1)...
	fmt.Println(post("/v1/complete", `{"key":"msg-1","token":1,"result":"ok:42"}`))
	// ...and every later duplicate gets it back.
	fmt.Println(post("/v1/claim", `{"key":"msg-1"}`))
	// Output:
	// 201 {"status":"acquired"
	// 409 {"status":"in_progress"
	// 200 {"status":"completed"}
	// 200 {"status":"completed","token":1,"attempts":1,"result":"ok:42","replayed":true}
}
