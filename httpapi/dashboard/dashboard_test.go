package dashboard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem/httpapi/dashboard"
)

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(dashboard.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
		ctype, body  string
	}{
		{"GET", "/", 200, "text/html", "<title>idem dashboard</title>"},
		{"GET", "/app.js", 200, "javascript", "/v1/stats"},
		{"GET", "/style.css", 200, "text/css", ".cards"},
		{"HEAD", "/", 200, "text/html", ""},
		{"GET", "/nope", 404, "", ""},
		{"GET", "/../go.mod", 404, "", ""},
		{"POST", "/", 405, "", ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(resp.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(body), tc.body) {
			t.Errorf("%s %s: %d %q, want %d %q containing %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.code, tc.ctype, tc.body)
		}
		if tc.code == 200 && !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("%s: no Content-Security-Policy", tc.path)
		}
	}
}
