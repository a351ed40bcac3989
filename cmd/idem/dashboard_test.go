package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium is the browser the dashboard test drives: CI installs Debian's
// chromium (scripts/services). The test fails, never skips, without it.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IDEM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH (apt-get install chromium; scripts/services installs it) and $IDEM_CHROMIUM unset")
	return ""
}

// dashLoad drives the API of srv like a set of consumers until stop: new
// keys completed, duplicates replayed, some attempts released with an
// error, some keys failed (dead-lettered), a few held in progress.
func dashLoad(t *testing.T, base string, stop <-chan struct{}) *sync.WaitGroup {
	call := func(path string, body any) map[string]any {
		b, _ := json.Marshal(body)
		resp, err := http.Post(base+path, "application/json", bytes.NewReader(b))
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return m
	}
	token := func(m map[string]any) uint64 {
		f, _ := m["token"].(float64)
		return uint64(f)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			key := fmt.Sprintf("order-%d", i)
			switch {
			case i%40 == 7: // held: a worker still on it
				call("/v1/claim", map[string]any{"key": key, "lease_ms": 120000})
			case i%25 == 3: // poison: dead-lettered
				m := call("/v1/claim", map[string]any{"key": key})
				call("/v1/fail", map[string]any{"key": key, "token": token(m), "error": "card declined (permanent)"})
			case i%10 == 1: // flaky: released for a retry
				m := call("/v1/claim", map[string]any{"key": key})
				call("/v1/release", map[string]any{"key": key, "token": token(m), "error": "payment gateway timeout"})
			default:
				m := call("/v1/claim", map[string]any{"key": key})
				call("/v1/complete", map[string]any{"key": key, "token": token(m), "result": `{"charged":true}`})
			}
			if i%3 == 0 && i > 0 { // a redelivery of an earlier message: replayed
				call("/v1/claim", map[string]any{"key": fmt.Sprintf("order-%d", i/2)})
			}
		}
	})
	return &wg
}

// TestDashboardInChromium loads the dashboard of a real `idem serve` in
// headless Chromium: the figures start at zero, change under load (claims,
// duplicate rate, latency, keys in progress, recent failures), and the key
// search shows a record. IDEM_DASHBOARD_PNG=path keeps a screenshot
// (docs/dashboard.png is made so).
func TestDashboardInChromium(t *testing.T) {
	exe := chromium(t)
	srv := start(t, "serve", "--store", "memory://", "--addr", "127.0.0.1:0", "--log-level", "warn")
	defer srv.stop()

	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1050),
	)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	text := func(sel string) string {
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	rows := func(sel string) int {
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return n
	}
	num := func(sel string) float64 {
		v, _ := strconv.ParseFloat(strings.TrimSuffix(strings.ReplaceAll(text(sel), ",", ""), " %"), 64)
		return v
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.url+"/"), chromedp.WaitVisible(chromedp.CSS("#claims-rate"))); err != nil {
		t.Fatalf("load the dashboard: %v", err)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("dashboard: %s not seen within 20s (status %q)", what, text("#status"))
			}
		}
	}
	waitFor("live status", func() bool { return strings.HasPrefix(text("#status"), "live") })
	if got := text("#total-claims"); got != "0" {
		t.Fatalf("claims before any load: %q, want 0", got)
	}

	stop := make(chan struct{})
	load := dashLoad(t, srv.url, stop)
	defer func() { close(stop); load.Wait() }()

	waitFor("claims counted", func() bool { return num("#total-claims") > 0 })
	first := num("#total-claims")
	waitFor("the claim count growing", func() bool { return num("#total-claims") > first })
	waitFor("a throughput", func() bool { return num("#claims-rate") > 0 })
	waitFor("a duplicate rate", func() bool { return num("#dup-rate") > 0 })
	waitFor("latency percentiles", func() bool { return num("#p99") > 0 && num("#p50") > 0 })
	waitFor("keys in progress", func() bool { return rows("#inprogress-table tbody tr") > 0 && num("#rec-in_progress") > 0 })
	waitFor("a dead-lettered key", func() bool { return strings.Contains(text("#failures-table tbody"), "failed: dead-lettered") })
	waitFor("a released attempt", func() bool { return strings.Contains(text("#failures-table tbody"), "released: will retry") })

	// Key search: a completed key and one never claimed.
	search := func(key string, shown string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById("search-key").value = ""; true`)); err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Do(bctx, chromedp.SendKeys(chromedp.CSS("#search-key"), key),
			chromedp.Click(chromedp.CSS("#search-form button")), chromedp.WaitVisible(chromedp.CSS(shown))); err != nil {
			t.Fatalf("key search of %q: %v", key, err)
		}
	}
	search("order-2", "#record-table")
	rec := text("#record-table")
	for _, want := range []string{"order-2", "completed", `{"charged":true}`} {
		if !strings.Contains(rec, want) {
			t.Errorf("record shown: %q, want %q in it", rec, want)
		}
	}
	search("never-seen", "#record p.msg")
	if got := text("#record"); !strings.Contains(got, "No live record") {
		t.Errorf("unknown key: %q", got)
	}
	search("order-2", "#record-table")

	if path := os.Getenv("IDEM_DASHBOARD_PNG"); path != "" {
		time.Sleep(12 * time.Second) // let the charts fill a little more
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
