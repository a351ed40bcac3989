package chaos

import (
	"strconv"
	"strings"

	"github.com/idem-dev/idem/e2etest"
)

// Messages are e2etest's: message i has id e2etest.ID(i) ("msg-0000042")
// and payload e2etest.Payload(i) ({"n":42}), so a ledger row carrying
// another message's payload is caught.

// index is the number of message id, as made by e2etest.ID.
func index(id string) (int, bool) {
	s, ok := strings.CutPrefix(id, "msg-")
	if !ok || len(s) < 7 {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	return i, err == nil && i >= 0 && e2etest.ID(i) == id
}

// isPoison: message i always fails its handler.
func isPoison(i, every int) bool { return every > 0 && i%every == 13 }

// isPermanent: a poison message that fails with idem.Permanent
// (dead-lettered at its first failure; the others use up MaxAttempts).
func isPermanent(i, every int) bool { return every > 0 && i%(2*every) == 13 }

// isFlaky: message i fails its first handler call in each process.
func isFlaky(i int) bool { return i%50 == 7 }
