package promidem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/promidem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// A guard whose claims are counted, served at /metrics. A consumer adds
// col.ConsumerHooks() to its Config.Hooks and is passed to
// col.WatchConsumer; an outbox relay takes col.OutboxHooks().
func Example() {
	ctx := context.Background()
	col, _ := promidem.New(promidem.Config{Namespace: "payments"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)

	store, _ := memstore.New(memstore.Config{SweepInterval: -1})
	defer store.Close()
	col.WatchStore(store) // idem_records by state, polled at scrape time
	guard, _ := idem.NewGuard(store, idem.WithHooks(col.GuardHooks()))
	defer guard.Close()
	charge := func(ctx context.Context) ([]byte, error) { return []byte("charged"), nil }
	_, _ = guard.Do(ctx, []byte("order-42"), charge)
	_, _ = guard.Do(ctx, []byte("order-42"), charge) // a duplicate: replayed

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, `idem_claims_total{idem_namespace="payments",outcome="acquired"}`) ||
			strings.HasPrefix(line, `idem_claims_total{idem_namespace="payments",outcome="completed"}`) ||
			strings.HasPrefix(line, `idem_records{idem_namespace="payments",state="completed"}`) {
			fmt.Println(line)
		}
	}
	// Output:
	// idem_claims_total{idem_namespace="payments",outcome="acquired"} 1
	// idem_claims_total{idem_namespace="payments",outcome="completed"} 1
	// idem_records{idem_namespace="payments",state="completed"} 1
}
