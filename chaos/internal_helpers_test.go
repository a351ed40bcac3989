package chaos

import (
	"net"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/chaos/internal/remotestore"
)

// serveStore serves st on a loopback port for the test.
func serveStore(t *testing.T, st idem.Store) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = remotestore.Serve(ln, st)
	}()
	return ln.Addr().String(), func() {
		ln.Close()
		<-done
	}
}
