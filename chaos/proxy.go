package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	_ "github.com/Shopify/toxiproxy/v2/toxics" // registers latency, reset_peer, timeout...
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

var (
	toxOnce sync.Once
	toxSrv  *toxiproxy.ApiServer
)

func toxServer() *toxiproxy.ApiServer {
	toxOnce.Do(func() {
		toxSrv = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	})
	return toxSrv
}

// storeProxy is the in-process TCP proxy (toxiproxy) between the workers
// and the store: latency, resets and dropped connections are its toxics;
// an outage is the proxy disabled (open connections closed, new ones
// refused).
type storeProxy struct {
	p *toxiproxy.Proxy
}

func newStoreProxy(name, listenHost, upstream string) (*storeProxy, error) {
	p := toxiproxy.NewProxy(toxServer(), name, listenHost+":0", upstream)
	if err := p.Start(); err != nil {
		return nil, err
	}
	return &storeProxy{p: p}, nil
}

// Addr is where workers connect.
func (s *storeProxy) Addr() string { return s.p.Listen }

// Toxic adds a toxic given as toxiproxy's JSON.
func (s *storeProxy) Toxic(json string) error {
	_, err := s.p.Toxics.AddToxicJson(strings.NewReader(json))
	return err
}

// Clear removes every toxic.
func (s *storeProxy) Clear() { s.p.Toxics.ResetToxics(context.Background()) }

// Down disables the proxy (true) or enables it again (false).
func (s *storeProxy) Down(down bool) error {
	if down {
		s.p.Stop()
		return nil
	}
	if err := s.p.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		return fmt.Errorf("proxy start: %w", err)
	}
	return nil
}

func (s *storeProxy) Close() { s.p.Stop() }
