package httpidem_test

import (
	"testing"

	"github.com/idem-dev/idem/internal/leakcheck"
)

// TestMain fails the run when a test leaves a goroutine behind (a heartbeat
// or background completer not stopped by Guard.Close).
func TestMain(m *testing.M) { leakcheck.Main(m) }
